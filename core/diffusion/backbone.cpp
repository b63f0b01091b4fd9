// core/diffusion/backbone.cpp — the diffusion backbone contract (dew/diffusion.hpp): the image option
// keys and the label check every backbone shares.
#include "dew/diffusion.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"

namespace dew::diffusion {

std::vector<OptionSpec> backbone_image_option_specs() {
  return {{"image_size", "32", "image side or 'height,width' (set by the diffusion objective from the data)"},
          {"in_channels", "3", "image channels (set by the diffusion objective)"},
          {"out_channels", "", "output channels (default in_channels; 2 x in_channels for a learned variance)"},
          {"num_classes", "0", "classes for label conditioning (0 = unconditional); label num_classes = null class"}};
}

Tensor checked_label(const std::map<std::string, Tensor>& in, int64_t batch, int64_t num_classes, const char* model) {
  auto it = in.find("label");
  if (it == in.end()) return {};
  Tensor l = it->second;
  DEW_CHECK(l.numel() == batch, model, ": 'label' has ", l.numel(), " entries for a batch of ", batch);
  if (l.dtype() != DType::i32) l = cast(l.detach(), DType::i32);
  l = reshape(l, {batch});
  for (int32_t v : l.to_ints())
    DEW_CHECK(v >= 0 && v <= num_classes, model, ": label ", v, " is outside [0, ", num_classes, "] (", num_classes,
              num_classes == 0 ? " is the null label of this unconditional model: model.num_classes = 0)"
                               : " is the null label; model.num_classes must cover every label)");
  return l;
}

}  // namespace dew::diffusion
