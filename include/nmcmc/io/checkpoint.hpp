#pragma once
/// Reading checkpoint archives (LibTorch serialisation with a JSON "meta" entry), shared by the
/// sampler trainer and the EBM trainer. Writing goes through write_atomically.
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

}  // namespace nmcmc
