// masks.hpp — I-JEPA multi-block masks on a patch grid (used by the jepa objective and its tests).
//
// Geometry (resolved once, static shapes): S = grid_h * grid_w tokens. A block area is chosen among the
// integers in [ceil(scale0 * S), floor(scale1 * S)] that have at least one factorisation h * w with
// h <= grid_h, w <= grid_w and aspect0 <= h / w <= aspect1: the area with the most factorisations, ties
// broken by the distance to the middle of the scale range (then the smaller area). Every target block
// has exactly that area A (its shape varies among the factorisations), so targets are [M, A]. The
// context block is resolved the same way from its own scale and aspect ranges (area C). The context is
// the context block minus the union of the M target blocks; it always keeps at least C - M*A tokens, and
// exactly num_context tokens (default C - M*A) are drawn from it uniformly, so it is [Nc] for every record.
// Impossible geometry (no admissible area, or no token left for the context) is refused with the reason.
//
// Sampling is a pure function of (seed, position): Philox stream kMaskStream + position, draws in a fixed
// order (per target: shape, top, left; then the context block's shape, top, left; then one key per
// candidate context token). Block tokens are listed in raster order; context tokens are sorted ascending;
// context and targets are disjoint by construction.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dew::jepa {

struct MaskSpec {
  int64_t grid_h = 0, grid_w = 0;
  int64_t num_targets = 4;
  double target_scale[2] = {0.15, 0.2};
  double target_aspect[2] = {0.75, 1.5};
  double context_scale[2] = {0.85, 1.0};
  double context_aspect[2] = {1.0, 1.0};
  int64_t num_context = 0;  // 0: the guaranteed minimum C - M*A
};

struct MaskGeometry {
  int64_t grid_h = 0, grid_w = 0, num_targets = 0;
  int64_t target_area = 0, context_area = 0, num_context = 0;
  std::vector<std::pair<int64_t, int64_t>> target_shapes, context_shapes;  // admissible (h, w)
  std::string describe() const;
};

// Throws dew::UsageError naming the reason when the geometry is impossible.
MaskGeometry resolve_masks(const MaskSpec& spec);

struct BlockPlacement {
  int64_t h = 0, w = 0, top = 0, left = 0;
};

struct RecordMasks {
  std::vector<int32_t> context;               // [Nc], ascending
  std::vector<int32_t> targets;               // [M * A], block-major, each block in raster order
  std::vector<BlockPlacement> target_blocks;  // [M]
  BlockPlacement context_block;
};

RecordMasks sample_masks(const MaskGeometry& g, uint64_t seed, uint64_t position);

// A batch's masks, rows position, position + 1, ...: context i32 [B * Nc], targets i32 [B * M * A].
struct BatchMasks {
  std::vector<int32_t> context, targets;
};
BatchMasks sample_batch_masks(const MaskGeometry& g, uint64_t seed, uint64_t first_position, int64_t batch);

}  // namespace dew::jepa
