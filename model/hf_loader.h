// The Hugging Face loader: a model directory as transformers saves it (config.json, safetensors
// weights in one file or shards, tokenizer.json, tokenizer_config.json, chat_template.jinja,
// generation_config.json: its eos ids end generation, its sampling fields are the defaults of
// requests that leave them unset) into a Model. F32, F16 and BF16 weights stay in their
// mappings, read in place by the CPU kernels (and uploaded by the CUDA forward; Model::Load may
// then quantise them for the CPU: --cpu-weight-type); norms and biases become floats. Errors
// name the file and the field or tensor at fault.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace winnow::model {

// `chat_template_path`, when not empty, replaces the directory's chat template.
absl::StatusOr<std::unique_ptr<Model>> LoadHfModel(const std::string& dir,
                                                   const std::string& chat_template_path = "");

}  // namespace winnow::model
