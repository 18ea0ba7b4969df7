#include "nmcmc/services/train.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/targets/targets.hpp"

namespace nmcmc {

using json = nlohmann::json;

json TrainConfig::to_json() const {
  return {{"name", name}, {"target", target}, {"model", model.to_json()}, {"train", train.to_json()}, {"dtype", dtype}};
}

TrainConfig parse_train_config(const json& j) {
  if (!j.is_object()) throw UsageError("a training config must be a JSON object");
  for (auto& [key, value] : j.items()) {
    if (key != "name" && key != "target" && key != "model" && key != "train" && key != "dtype" && key != "eval" &&
        key != "paper") {
      throw UsageError("config: unknown section '" + key + "'");
    }
  }
  if (!j.contains("target")) throw UsageError("config: missing \"target\"");
  TrainConfig c;
  c.name = j.value("name", std::string("run"));
  c.target = j["target"];
  json model = j.value("model", json::object());
  if (!model.contains("dim")) model["dim"] = 2;  // replaced by the target's dimension in train()
  c.model = LearnedOptions::from_json(model);
  c.train = TrainOptions::from_json(j.value("train", json::object()));
  c.dtype = j.value("dtype", std::string("float32"));
  if (c.dtype != "float32" && c.dtype != "float64") throw UsageError("config: dtype must be float32 or float64");
  return c;
}

TrainResult train(const TrainConfig& config, torch::Device device, const std::string& output,
                  const std::string& log_path, bool resume, const TrainProgressFn& progress,
                  const std::function<bool()>& should_stop) {
  auto options = torch::TensorOptions().dtype(config.dtype == "float64" ? torch::kFloat64 : torch::kFloat32).device(device);
  auto target = make_target(config.target, options);
  LearnedOptions model = config.model;
  model.dim = target->dim();
  Trainer trainer(*target, LearnedSampler(model).ptr(), config.train);
  const json extra = {{"name", config.name}, {"config", config.to_json()}};
  if (resume && std::filesystem::exists(output)) trainer.load(output);
  TrainResult result;
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  const int64_t total = config.train.steps;
  auto checkpoint = [&] {
    trainer.save(output, extra);
    write_training_log(log_path, trainer.log());
  };
  while (trainer.current_step() < total) {
    if (should_stop && should_stop()) {
      checkpoint();
      result.interrupted = true;
      break;
    }
    TrainStats s = trainer.step();
    if (s.step % config.train.checkpoint_every == 0 || s.step == total) checkpoint();
    auto now = std::chrono::steady_clock::now();
    if (progress && (std::chrono::duration<double>(now - last).count() > 0.5 || s.step == total)) {
      last = now;
      progress({s, total, std::chrono::duration<double>(now - t0).count()});
    }
  }
  if (total == 0 || (trainer.current_step() == total && !std::filesystem::exists(output))) checkpoint();
  result.steps = trainer.current_step();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.log = trainer.log();
  result.grads = result.log.empty() ? 0 : result.log.back().grads;
  return result;
}

}  // namespace nmcmc
