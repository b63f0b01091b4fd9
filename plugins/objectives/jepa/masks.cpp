// masks.cpp — I-JEPA multi-block masks (see masks.hpp for the geometry and the sampling contract).
#include "masks.hpp"

#include <algorithm>
#include <cmath>
#include <dew/error.hpp>
#include <dew/random.hpp>
#include <numeric>
#include <sstream>
#include <tuple>

namespace dew::jepa {

namespace {

const uint64_t kMaskStream = philox::stream_of("jepa/masks");

std::string range_str(const double r[2]) {
  std::ostringstream s;
  s << "[" << r[0] << ", " << r[1] << "]";
  return s.str();
}

// The admissible block of a scale and aspect range: (area, shapes). `what` names it in errors.
std::pair<int64_t, std::vector<std::pair<int64_t, int64_t>>> resolve_block(int64_t gh, int64_t gw,
                                                                           const double scale[2],
                                                                           const double aspect[2],
                                                                           const std::string& what) {
  const int64_t s = gh * gw;
  DEW_USAGE_CHECK(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1.0, "jepa masks: the ", what, " scale range ",
                  range_str(scale), " must satisfy 0 < low <= high <= 1");
  DEW_USAGE_CHECK(aspect[0] > 0 && aspect[0] <= aspect[1], "jepa masks: the ", what, " aspect range ",
                  range_str(aspect), " must satisfy 0 < low <= high");
  // A small tolerance so that e.g. 0.2 * 49 = 9.8 and 1.0 * 49 are not lost to rounding.
  const int64_t lo = int64_t(std::ceil(scale[0] * double(s) - 1e-9));
  const int64_t hi = int64_t(std::floor(scale[1] * double(s) + 1e-9));
  DEW_USAGE_CHECK(lo <= hi, "jepa masks: impossible geometry: the ", what, " scale range ", range_str(scale), " of a ",
                  gh, "x", gw, " grid (", s, " tokens) holds no whole number of tokens (", scale[0] * double(s), " .. ",
                  scale[1] * double(s), ")");
  const double mid = 0.5 * (scale[0] + scale[1]) * double(s);
  int64_t best = -1;
  std::vector<std::pair<int64_t, int64_t>> best_shapes;
  for (int64_t area = lo; area <= hi; ++area) {
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (int64_t h = 1; h <= std::min(gh, area); ++h) {
      if (area % h) continue;
      const int64_t w = area / h;
      const double ar = double(h) / double(w);
      if (w <= gw && ar >= aspect[0] - 1e-9 && ar <= aspect[1] + 1e-9) shapes.emplace_back(h, w);
    }
    if (shapes.empty()) continue;
    const bool better =
        best < 0 || shapes.size() > best_shapes.size() ||
        (shapes.size() == best_shapes.size() && std::abs(double(area) - mid) < std::abs(double(best) - mid));
    if (better) {
      best = area;
      best_shapes = std::move(shapes);
    }
  }
  DEW_USAGE_CHECK(best > 0, "jepa masks: impossible geometry: no ", what, " block of ", lo, " to ", hi,
                  " tokens fits the ", gh, "x", gw, " patch grid with an aspect ratio (height / width) in ",
                  range_str(aspect), "; widen the ", what, " scale or aspect range");
  return {best, best_shapes};
}

}  // namespace

std::string MaskGeometry::describe() const {
  std::ostringstream s;
  s << num_targets << " target blocks of " << target_area << " tokens (";
  for (size_t i = 0; i < target_shapes.size(); ++i)
    s << (i ? " or " : "") << target_shapes[i].first << "x" << target_shapes[i].second;
  s << "), context " << num_context << " tokens of a " << context_area << "-token block on a " << grid_h << "x"
    << grid_w << " grid";
  return s.str();
}

MaskGeometry resolve_masks(const MaskSpec& spec) {
  DEW_USAGE_CHECK(spec.grid_h > 0 && spec.grid_w > 0, "jepa masks: empty patch grid");
  DEW_USAGE_CHECK(spec.num_targets >= 1, "jepa masks: num_targets must be at least 1, got ", spec.num_targets);
  MaskGeometry g;
  g.grid_h = spec.grid_h;
  g.grid_w = spec.grid_w;
  g.num_targets = spec.num_targets;
  std::tie(g.target_area, g.target_shapes) =
      resolve_block(g.grid_h, g.grid_w, spec.target_scale, spec.target_aspect, "target");
  std::tie(g.context_area, g.context_shapes) =
      resolve_block(g.grid_h, g.grid_w, spec.context_scale, spec.context_aspect, "context");
  const int64_t guaranteed = g.context_area - g.num_targets * g.target_area;
  DEW_USAGE_CHECK(guaranteed >= 1, "jepa masks: impossible geometry: ", g.num_targets, " target blocks of ",
                  g.target_area, " tokens can cover the whole ", g.context_area, "-token context block of the ",
                  g.grid_h, "x", g.grid_w,
                  " grid, leaving no context; use fewer or smaller targets or a larger "
                  "context block");
  DEW_USAGE_CHECK(spec.num_context >= 0 && spec.num_context <= guaranteed,
                  "jepa masks: num_context = ", spec.num_context, " but the context block always keeps only ",
                  guaranteed, " tokens (", g.context_area, " - ", g.num_targets, " x ", g.target_area,
                  "); use 0 (= ", guaranteed, ") or fewer");
  g.num_context = spec.num_context > 0 ? spec.num_context : guaranteed;
  return g;
}

RecordMasks sample_masks(const MaskGeometry& g, uint64_t seed, uint64_t position) {
  const uint64_t stream = kMaskStream + position;
  uint64_t draw = 0;
  auto u = [&] { return philox::uniform(seed, stream, draw++); };
  auto pick = [&](int64_t n) { return std::min<int64_t>(n - 1, int64_t(u() * float(n))); };
  auto place = [&](const std::vector<std::pair<int64_t, int64_t>>& shapes) {
    BlockPlacement b;
    std::tie(b.h, b.w) = shapes[size_t(pick(int64_t(shapes.size())))];
    b.top = pick(g.grid_h - b.h + 1);
    b.left = pick(g.grid_w - b.w + 1);
    return b;
  };
  RecordMasks r;
  auto is_target = std::vector<uint8_t>(size_t(g.grid_h * g.grid_w), 0);
  r.targets.reserve(size_t(g.num_targets * g.target_area));
  for (int64_t m = 0; m < g.num_targets; ++m) {
    const BlockPlacement b = place(g.target_shapes);
    r.target_blocks.push_back(b);
    for (int64_t y = b.top; y < b.top + b.h; ++y)
      for (int64_t x = b.left; x < b.left + b.w; ++x) {
        r.targets.push_back(int32_t(y * g.grid_w + x));
        is_target[size_t(y * g.grid_w + x)] = 1;
      }
  }
  r.context_block = place(g.context_shapes);
  const BlockPlacement& c = r.context_block;
  std::vector<std::pair<float, int32_t>> candidates;
  for (int64_t y = c.top; y < c.top + c.h; ++y)
    for (int64_t x = c.left; x < c.left + c.w; ++x)
      if (!is_target[size_t(y * g.grid_w + x)]) candidates.emplace_back(0.0f, int32_t(y * g.grid_w + x));
  DEW_CHECK(int64_t(candidates.size()) >= g.num_context, "jepa masks: internal error: ", candidates.size(),
            " context candidates for ", g.num_context, " tokens");
  for (auto& cand : candidates) cand.first = u();  // a uniform subset: the num_context smallest keys
  std::partial_sort(candidates.begin(), candidates.begin() + g.num_context, candidates.end());
  for (int64_t i = 0; i < g.num_context; ++i) r.context.push_back(candidates[size_t(i)].second);
  std::sort(r.context.begin(), r.context.end());
  return r;
}

BatchMasks sample_batch_masks(const MaskGeometry& g, uint64_t seed, uint64_t first_position, int64_t batch) {
  BatchMasks out;
  out.context.reserve(size_t(batch * g.num_context));
  out.targets.reserve(size_t(batch * g.num_targets * g.target_area));
  for (int64_t i = 0; i < batch; ++i) {
    const RecordMasks r = sample_masks(g, seed, first_position + uint64_t(i));
    out.context.insert(out.context.end(), r.context.begin(), r.context.end());
    out.targets.insert(out.targets.end(), r.targets.begin(), r.targets.end());
  }
  return out;
}

}  // namespace dew::jepa
