// Importing weights written by PyTorch: torchvision encoders (--encoder-weights) and whole
// reference models (--init-weights), with the name maps between their state_dict keys and
// dptrain's.
#pragma once

#include <string>
#include <vector>

#include "dp/params.hpp"

namespace dp {

inline constexpr const char* kTorchWeightsFormat = "dp-torch-weights-v1";

// dptrain's name for a PyTorch state_dict key of `model`, accepting every spelling:
//   unet16:      torchvision vgg16 `features.N.*`, the reference's `encoder.N.*`, or `convK.I.*`;
//   unet_resnet: torchvision `conv1.*`, `bn1.*`, `layerK.*` (with or without the reference's
//                `encoder.` prefix), or `conv1.0.*`, `conv1.1.*`, `convK.*`.
// Returns "" for keys that have no counterpart (`fc.*`, `num_batches_tracked`, VGG classifier).
std::string canonical_weight_name(const std::string& model, const std::string& key);

// True for dptrain names that belong to the encoder (what --encoder-weights replaces).
bool is_encoder_weight(const std::string& model, const std::string& name);

struct ImportReport {
  int loaded = 0;                    // tensors copied into the model
  std::vector<std::string> ignored;  // keys in the file without a counterpart
};

// Reads tensors from `path` — an HDF5 file of PyTorch keys (root datasets, written by
// tools/export_torchvision.py or tools/pt_to_h5.py) or a dptrain checkpoint (/params, /buffers) —
// into `params` and `buffers`. With `encoder_only`, exactly the encoder's tensors are required
// and loaded; otherwise every tensor of the model. Shapes are checked; the first missing or
// mismatching tensor is a dp::Error naming it, the file and both shapes.
ImportReport import_weights(const std::string& path, const std::string& model, ParamStore& params,
                            ParamStore& buffers, bool encoder_only);

}  // namespace dp
