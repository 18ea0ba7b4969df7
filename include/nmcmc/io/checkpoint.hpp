#pragma once
/// Reading checkpoint archives (LibTorch serialisation with a JSON "meta" entry), shared by the
/// sampler trainer and the EBM trainer, and writing them (atomically).
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <string>

namespace nmcmc {

/// Opens the archive at `path`, its tensors mapped to `device`. `what` names the kind in messages
/// ("checkpoint", "EBM checkpoint"). DataError if it is missing, truncated or corrupt.
torch::serialize::InputArchive open_checkpoint(const std::string& path, const std::string& what,
                                               const torch::Device& device = torch::kCPU);

/// The archive's metadata; DataError unless it is JSON with "format" equal to `format`.
nlohmann::json read_checkpoint_meta(torch::serialize::InputArchive& ar, const std::string& path,
                                    const std::string& what, const std::string& format);

/// Adds `meta` (as its JSON "meta" entry) to the archive and writes it to `path` atomically
/// (temporary file, fsync, rename: the same as every other output).
void write_checkpoint(const std::string& path, torch::serialize::OutputArchive& ar, const nlohmann::json& meta);

}  // namespace nmcmc
