#pragma once
// Loads a Hugging Face checkpoint folder (config.json + safetensors weights) into fp32 host
// weights. Weights come from a single model.safetensors or from shards listed in
// model.safetensors.index.json. Every expected tensor is looked up by its HF name (see
// for_each_weight), so errors name the tensor the user can find in their checkpoint.
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/finite.hpp"
#include "../math/rmsnorm.hpp"
#include "../model/config.hpp"
#include "../model/weights.hpp"
#include "detail/json_file.hpp"
#include "detail/json_text.hpp"
#include "hf_config.hpp"
#include "safetensors.hpp"

namespace dc {

struct HfModel {
  ModelConfig config;
  HostWeights weights;
};

namespace detail {

// Tensors every decoder layer has (norms, Q/K/V/O, gate/up/down): see for_each_weight.
inline constexpr std::size_t kTensorsPerLayer = 9;

// The same for a given model: Gemma adds the q/k norms and two output norms.
inline std::size_t tensors_per_layer(const ModelConfig& c) {
  return kTensorsPerLayer + (c.qk_norm ? 2 : 0) + (c.sandwich_norms ? 2 : 0);
}

// Where each tensor of a checkpoint lives: one file, or a weight_map over shard files.
class HfWeightSource {
 public:
  explicit HfWeightSource(const std::filesystem::path& folder) {
    const auto single = folder / "model.safetensors";
    const auto index = folder / "model.safetensors.index.json";
    if (std::filesystem::exists(single)) {
      searched_ = single.string();
      files_.emplace("model.safetensors", std::make_unique<SafetensorsFile>(single));
    } else if (std::filesystem::exists(index)) {
      searched_ = index.string() + " (weight_map)";
      read_index(folder, index);
    } else {
      DC_FAIL(folder.string(), ": no model.safetensors or model.safetensors.index.json");
    }
  }

  // The file holding `name`, or nullptr when the checkpoint does not have it.
  const SafetensorsFile* find(const std::string& name) const {
    if (weight_map_.empty()) {
      const SafetensorsFile& only = *files_.begin()->second;
      return only.contains(name) ? &only : nullptr;
    }
    auto it = weight_map_.find(name);
    if (it == weight_map_.end()) return nullptr;
    const SafetensorsFile& shard = *files_.at(it->second);
    DC_CHECK(shard.contains(name), searched_, ": tensor '", name, "' is mapped to shard '",
             it->second, "', which does not contain it");
    return &shard;
  }

  // How many tensors the checkpoint names (the index's weight_map, or the single file's).
  std::size_t tensor_count() const {
    return weight_map_.empty() ? files_.begin()->second->names().size() : weight_map_.size();
  }

  // Describes what was searched, for "missing tensor" messages.
  const std::string& searched() const { return searched_; }

 private:
  void read_index(const std::filesystem::path& folder, const std::filesystem::path& index) {
    const std::string source = index.string();
    const nlohmann::json j = detail::read_json_file(index);
    DC_CHECK(j.is_object() && j.contains("weight_map") && j.at("weight_map").is_object(), source,
             ": field 'weight_map' missing or not an object");
    for (const auto& [tensor, shard_json] : j.at("weight_map").items()) {
      DC_CHECK(shard_json.is_string(), source, ": weight_map entry for tensor '", tensor,
               "' must be a string, got ", detail::json_text(shard_json));
      const std::string shard = shard_json.get<std::string>();
      // Shards must sit in the checkpoint folder itself: a name with a path separator or a dot
      // directory could make a downloaded index read arbitrary files.
      const bool plain_name = !shard.empty() && shard != "." && shard != ".." &&
                              shard.find_first_of("/\\") == std::string::npos &&
                              shard.find('\0') == std::string::npos;
      DC_CHECK(plain_name, source, ": shard name '", shard, "' for tensor '", tensor,
               "' must be a plain file name inside the folder");
      if (!files_.count(shard)) {
        const auto shard_path = folder / shard;
        DC_CHECK(std::filesystem::is_regular_file(shard_path), source, ": shard '", shard,
                 "' (for tensor '", tensor, "') does not exist in ", folder.string());
        files_.emplace(shard, std::make_unique<SafetensorsFile>(shard_path));
      }
      weight_map_.emplace(tensor, shard);
    }
    DC_CHECK(!files_.empty(), source, ": weight_map is empty");
  }

  std::string searched_;
  // Shard file name -> opened file (headers only). unique_ptr keeps addresses stable.
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::string> weight_map_;  // tensor name -> shard file name
};

inline std::string shape_str(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace detail

inline HfModel load_hf_model(const std::filesystem::path& folder) {
  HfModel model;
  model.config = load_hf_config(folder / "config.json");
  const detail::HfWeightSource source(folder);
  // for_each_weight sizes the layer list before it asks for a layer's tensors, so a layer count
  // the checkpoint cannot back would allocate without bound (see fuzz/README.md).
  const std::size_t per_layer = detail::tensors_per_layer(model.config);
  DC_CHECK(std::size_t(model.config.num_layers) <= source.tensor_count() / per_layer,
           "checkpoint ", folder.string(), ": config says num_hidden_layers = ",
           model.config.num_layers, " but ", source.searched(), " has only ", source.tensor_count(),
           " tensors (", per_layer, " per layer)");
  // Gemma checkpoints store norm weights w of y = norm(x) * (1 + w); the weights hold the
  // multiplier (model/weights.hpp), so the offset is added here, once, in fp32.
  const bool offset_norms = model.config.architecture == "gemma3";

  // Tied checkpoints keep only model.embed_tokens.weight; for_each_weight then never asks for
  // lm_head.weight, so a redundant copy in the file is simply not read.
  for_each_weight(model.config, model.weights,
                  [&](const std::string& name, Tensor<float, cpu>& slot, Shape expected) {
                    const SafetensorsFile* file = source.find(name);
                    DC_CHECK(file != nullptr, "checkpoint ", folder.string(), ": tensor '", name,
                             "' missing (searched ", source.searched(), ")");
                    const auto& actual = file->info(name).shape;
                    bool same = actual.size() == static_cast<std::size_t>(expected.rank);
                    for (std::size_t i = 0; same && i < actual.size(); ++i)
                      same = actual[i] == expected.dims[i];
                    DC_CHECK(same, "checkpoint ", file->path().string(), ": tensor '", name,
                             "' has shape ", detail::shape_str(actual), ", expected ", expected.str());
                    slot = file->read_float(name);
                    if (offset_norms && name.find("norm") != std::string::npos)
                      for (std::int64_t i = 0; i < slot.numel(); ++i)
                        slot.data()[i] = math::offset_norm_multiplier(slot.data()[i]);
                    // A NaN or inf weight would poison every logit: reject it here, by name.
                    check_all_finite(std::span<const float>(slot.data(), std::size_t(slot.numel())),
                                     detail::concat("checkpoint ", file->path().string(),
                                                    ": tensor '", name, "'"));
                  });
  return model;
}

}  // namespace dc
