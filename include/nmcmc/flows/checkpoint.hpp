#pragma once
/// Reading a learned sampler's checkpoint (written by training/trainer.hpp's Trainer::save): its
/// model for sampling, its bootstrap buffer, its metadata. Sampling a trained model needs only
/// this layer, not training/.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "nmcmc/flows/learned.hpp"
#include "nmcmc/flows/transport.hpp"
#include "nmcmc/kernels/proposal.hpp"

namespace nmcmc {

/// The checkpoint format this nmcmc reads and writes (meta "version").
constexpr int kLearnedCheckpointVersion = 2;

/// Opens a checkpoint's archive (DataError if unreadable).
torch::serialize::InputArchive open_learned_checkpoint(const std::string& path);
/// Its metadata (DataError if absent, or of another format version).
nlohmann::json read_learned_meta(torch::serialize::InputArchive& archive, const std::string& path);

/// Loads only the model of a checkpoint (for sampling): returns the sampler and the metadata.
/// Throws DataError for a truncated or corrupt file.
std::pair<LearnedSampler, nlohmann::json> load_model(const std::string& path);

/// The shard count a checkpoint was trained with (1 for checkpoints without one), or nullopt when
/// `path` cannot be read as a checkpoint.
std::optional<int64_t> checkpoint_shards(const std::string& path);

/// The bootstrap buffer of a checkpoint (the sampler's own chains), or an undefined tensor.
torch::Tensor load_buffer(const std::string& path);

/// Note [Learned proposal in a flow's latent space]
/// A model trained with a flow transport (`nmcmc train --transport flow`, services/train.hpp)
/// proposes in the flow's latent space z = T^-1(x): its checkpoint holds the flow (archive entry
/// "transport", meta "transport": {"kind": "flow", "flow": FlowOptions, ...}) and its buffer in z.
/// Sampling runs the model on TransportedTarget(target, flow) and maps the draws to x.

/// Writes a flow transport into a checkpoint archive (entry "transport").
void write_transport(torch::serialize::OutputArchive& ar, const FlowTransportImpl& flow);
/// The flow of a checkpoint whose meta has "transport", else an undefined FlowTransport (DataError
/// for a corrupt one). Its parameters are frozen (requires_grad false).
FlowTransport load_transport(torch::serialize::InputArchive& ar, const nlohmann::json& meta, const std::string& path);

/// A trained learned sampler ready to run: its proposal, the target it was trained on, the
/// checkpoint's metadata and the tensor options to run it with.
struct LearnedRun {
  std::shared_ptr<Proposal> proposal;
  nlohmann::json target_spec;
  nlohmann::json meta;
  torch::TensorOptions options;
  FlowTransport transport{nullptr};  // defined: the model proposes in this flow's latent space
  bool other_data = false;           // the same Stan program on other data than it was trained on
};
/// Loads the checkpoint at `model_path` (DataError if unreadable). A given `target_spec` must
/// describe the model's own target (UsageError otherwise), or the same Stan program on other data
/// with the same parameters (Note [Training from a previous model]: other_data, target_spec the
/// given one; its affine map is then the old posterior's, and the run checks the fit). The model runs in `options`' dtype
/// when `dtype_given`, else in the dtype it was trained in; its networks multiply as `matmul`
/// and `gemm` say when given, else as its checkpoint says (Note [Linear-layer policy]); its step and
/// its flow's passes run on `engine` when given, else on the checkpoint's (Note [Native copies]).
LearnedRun load_learned_run(const std::string& model_path, const std::optional<nlohmann::json>& target_spec,
                            torch::TensorOptions options, bool dtype_given,
                            const std::optional<MatmulOption>& matmul = std::nullopt,
                            const std::optional<GemmBackend>& gemm = std::nullopt,
                            const std::optional<Engine>& engine = std::nullopt);

}  // namespace nmcmc
