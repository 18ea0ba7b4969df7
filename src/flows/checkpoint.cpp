#include "nmcmc/flows/checkpoint.hpp"

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/checkpoint.hpp"
#include "nmcmc/nn/deferred_linear.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;

torch::serialize::InputArchive open_learned_checkpoint(const std::string& path) { return open_checkpoint(path, "checkpoint"); }

json read_learned_meta(torch::serialize::InputArchive& ar, const std::string& path) {
  json j = read_checkpoint_meta(ar, path, "checkpoint", "nmcmc-checkpoint");
  if (j.value("version", 0) != kLearnedCheckpointVersion) {
    throw DataError("checkpoint '" + path + "' has format version " + std::to_string(j.value("version", 0)) +
                    "; this nmcmc reads version " + std::to_string(kLearnedCheckpointVersion) + " (retrain it)");
  }
  return j;
}

std::optional<int64_t> checkpoint_shards(const std::string& path) {
  try {
    auto ar = open_learned_checkpoint(path);
    json meta = read_learned_meta(ar, path);
    return meta.value("shards", int64_t{1});
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::pair<LearnedSampler, json> load_model(const std::string& path) {
  auto ar = open_learned_checkpoint(path);
  json meta = read_learned_meta(ar, path);
  LearnedOptions options;
  try {
    options = LearnedOptions::from_json(meta.at("model"));
  } catch (const std::exception& e) {
    throw DataError("checkpoint '" + path + "' has invalid model options: " + e.what());
  }
  LearnedSampler sampler(options);
  // Match the stored dtype before loading: Module::load does not convert.
  sampler->to(meta.value("dtype", "float32") == "float64" ? torch::kFloat64 : torch::kFloat32);
  try {
    torch::serialize::InputArchive model_ar;
    ar.read("model", model_ar);
    sampler->load(model_ar);
  } catch (const c10::Error& e) {
    throw DataError("checkpoint '" + path + "' is incomplete or corrupt: " + e.what_without_backtrace());
  }
  return {sampler, meta};
}

torch::Tensor load_buffer(const std::string& path) {
  auto ar = open_learned_checkpoint(path);
  torch::Tensor b;
  try {
    ar.read("buffer", b);
  } catch (const c10::Error&) {
    return torch::Tensor();
  }
  return b;
}

void write_transport(torch::serialize::OutputArchive& ar, const FlowTransportImpl& flow) {
  torch::serialize::OutputArchive sub;
  flow.save(sub);
  ar.write("transport", sub);
}

FlowTransport load_transport(torch::serialize::InputArchive& ar, const json& meta, const std::string& path) {
  if (!meta.contains("transport") || meta["transport"].is_null()) return FlowTransport(nullptr);
  FlowOptions options;
  try {
    options = meta.at("transport").at("flow").get<FlowOptions>();
  } catch (const std::exception& e) {
    throw DataError("checkpoint '" + path + "' has invalid transport options: " + e.what());
  }
  FlowTransport flow(options);
  try {
    torch::serialize::InputArchive sub;
    ar.read("transport", sub);
    flow->load(sub);
  } catch (const c10::Error& e) {
    throw DataError("checkpoint '" + path + "' has a corrupt or missing flow transport: " + e.what_without_backtrace());
  }
  for (auto& p : flow->parameters()) p.requires_grad_(false);
  return flow;
}

LearnedRun load_learned_run(const std::string& model_path, const std::optional<json>& target_spec,
                            torch::TensorOptions options, bool dtype_given,
                            const std::optional<MatmulOption>& matmul, const std::optional<GemmBackend>& gemm,
                            const std::optional<Engine>& engine) {
  auto [sampler, meta] = load_model(model_path);
  FlowTransport transport(nullptr);
  if (meta.contains("transport")) {
    auto ar = open_learned_checkpoint(model_path);
    transport = load_transport(ar, meta, model_path);
  }
  if (matmul) sampler->set_matmul(*matmul);
  if (gemm) sampler->set_gemm(*gemm);
  if (engine) {  // Note [Native copies]
    sampler->set_engine(*engine);
    if (transport) transport->set_engine(*engine);
  }
  const json trained_on = meta.at("target");
  bool other_data = false;
  json given;
  if (target_spec) {
    auto probe = make_target(*target_spec, options);
    // A TorchScript density is the module's content, not its location: a module saved elsewhere
    // (or passed in memory from Python) is accepted when the rest of the spec (dim, output) agrees;
    // a Stan program is accepted whichever build of it runs (density_of).
    if (density_of(probe->spec()) != density_of(trained_on)) {
      // The same Stan program on other data, with the same parameters, is accepted: sample() then
      // checks that the model still fits (Note [Training from a previous model]).
      auto program_of = [](const json& spec) {
        json s = density_of(spec);
        if (s.value("name", "") != "stan") return json();
        s.erase("data");
        return s;
      };
      const json program = program_of(probe->spec());
      const bool names_agree = !meta.contains("names") || meta["names"] == json(parameter_labels(*probe));
      if (program.is_null() || program != program_of(trained_on) || probe->dim() != sampler->options().dim || !names_agree) {
        throw UsageError("model '" + model_path + "' was trained on target " + trained_on.dump() + ", not " +
                         probe->spec().dump());
      }
      other_data = true;
      given = probe->spec();
    }
  }
  if (!dtype_given) options = options.dtype(meta.value("dtype", "float32") == "float64" ? torch::kFloat64 : torch::kFloat32);
  sampler->to(options.device(), options.dtype().toScalarType());
  sampler->eval();
  auto proposal = std::make_shared<LearnedProposal>(sampler);
  proposal->set_persistence(kDefaultPersistence);  // Note [Persistent noise]
  return {proposal, other_data ? given : trained_on, meta, options, transport, other_data};
}

}  // namespace nmcmc
