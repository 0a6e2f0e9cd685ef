// The GGUF loader: a llama.cpp model file (llama, qwen2 and qwen3 architectures) into a Model.
// It maps the file, reads the config and the tokenizer from its metadata, compiles the chat
// template, and checks every tensor's presence, type and shape; the weights stay in the mapping,
// in the file's quantisation. Errors name the key or tensor at fault.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace winnow::model {

// `chat_template_path`, when not empty, replaces the file's chat template (ChatTemplate::FromGguf).
absl::StatusOr<std::unique_ptr<Model>> LoadGgufModel(const std::string& path,
                                                     const std::string& chat_template_path = "");

}  // namespace winnow::model
