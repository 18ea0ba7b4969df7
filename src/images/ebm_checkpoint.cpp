// EBM checkpoints (atomic, resumable bit for bit) and the training log.
#include <cmath>
#include <sstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/images/ebm_trainer.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/checkpoint.hpp"

namespace nmcmc {

using json = nlohmann::json;

namespace {
constexpr int kEbmCheckpointVersion = 1;

json ebm_stats_to_json(const EbmStats& s) {
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  return {s.iteration, num(s.accept), num(s.mcmc_accept), num(s.entropy), num(s.jump), num(s.energy_diff), num(s.eps),
          num(s.beta), s.lr, s.updates, s.grads_sampling, s.grads_training, s.seconds, s.elapsed};
}
EbmStats ebm_stats_from_json(const json& j) {
  auto num = [](const json& v) { return v.is_number() ? v.get<double>() : NAN; };
  EbmStats s;
  s.iteration = j.at(0);
  s.accept = num(j.at(1));
  s.mcmc_accept = num(j.at(2));
  s.entropy = num(j.at(3));
  s.jump = num(j.at(4));
  s.energy_diff = num(j.at(5));
  s.eps = num(j.at(6));
  s.beta = num(j.at(7));
  s.lr = j.at(8);
  s.updates = j.at(9);
  s.grads_sampling = j.at(10);
  s.grads_training = j.at(11);
  s.seconds = j.at(12);
  s.elapsed = j.at(13);
  return s;
}

torch::serialize::InputArchive open_ebm_archive(const std::string& path, json& meta,
                                                const torch::Device& device = torch::kCPU) {
  // Tensors land where the trainer's live (Module::load would otherwise move parameters).
  auto ar = open_checkpoint(path, "EBM checkpoint", device);
  meta = read_checkpoint_meta(ar, path, "EBM checkpoint", "nmcmc-ebm-checkpoint");
  if (meta.value("version", 0) != kEbmCheckpointVersion) {
    throw DataError("EBM checkpoint '" + path + "' has an unsupported format version");
  }
  return ar;
}
}  // namespace

void EbmTrainer::save(const std::string& path) const {
  // Every rank's buffer rows and random streams, in rank order.
  const int world = comm_->world_size();
  torch::Tensor buffer = comm_->all_gather_rows(buffer_.to(torch::kCPU));
  torch::Tensor rng = comm_->all_gather_rows(gen_.get_state().unsqueeze(0));
  torch::Tensor rng_cpu = comm_->all_gather_rows(cpu_gen_.get_state().unsqueeze(0));
  if (!comm_->is_root()) return;
  torch::serialize::OutputArchive ar, ebm_ar, ebm_opt_ar;
  target_->net()->save(ebm_ar);
  ebm_opt_->save(ebm_opt_ar);
  ar.write("ebm", ebm_ar);
  ar.write("ebm_optimizer", ebm_opt_ar);
  if (sampler_trainer_) sampler_trainer_->save(ar, "sampler", "sampler_optimizer");
  ar.write("buffer", buffer);
  ar.write("rng", rng[0].clone());
  ar.write("rng_cpu", rng_cpu[0].clone());
  if (world > 1) {
    ar.write("rng_ranks", rng);
    ar.write("rng_cpu_ranks", rng_cpu);
  }
  json meta;
  meta["format"] = "nmcmc-ebm-checkpoint";
  meta["version"] = kEbmCheckpointVersion;
  meta["options"] = o_.to_json();
  meta["shape"] = {data_.size(1), data_.size(2), data_.size(3)};
  meta["iteration"] = it_;
  meta["updates"] = updates_;
  meta["beta"] = sampler_trainer_ ? sampler_trainer_->beta().value() : o_.beta;
  meta["log_eps_mala"] = log_eps_mala_;
  meta["grads_sampling"] = grads_sampling_;
  meta["grads_training"] = grads_training_;
  meta["elapsed"] = elapsed_;
  meta["world_size"] = world;
  json rows = json::array();
  for (const auto& s : log_) rows.push_back(ebm_stats_to_json(s));
  meta["log"] = rows;
  write_checkpoint(path, ar, meta);
}

void EbmTrainer::load(const std::string& path) {
  json meta;
  auto ar = open_ebm_archive(path, meta, buffer_.device());
  json mine = o_.to_json(), theirs = meta.at("options");
  // Everything but the run length and bookkeeping must match.
  for (const char* k : {"iterations", "checkpoint_every", "log_every", "longrun_steps", "device"}) {
    mine.erase(k);
    theirs.erase(k);
  }
  if (mine != theirs) throw DataError("EBM checkpoint '" + path + "' was written with different options: " + meta.at("options").dump());
  if (meta.at("shape") != json{data_.size(1), data_.size(2), data_.size(3)}) {
    throw DataError("EBM checkpoint '" + path + "' is for images of shape " + meta.at("shape").dump());
  }
  const int world = comm_->world_size(), stored_world = meta.value("world_size", 1);
  if (stored_world != world) {
    throw UsageError("EBM checkpoint '" + path + "' was written by " + std::to_string(stored_world) +
                     " process(es), each with its own replay-buffer rows and random streams; resume it with " +
                     std::to_string(stored_world) + (stored_world > 1 ? " (nmcmc launch --nproc " + std::to_string(stored_world) + ")" : "") +
                     ", not " + std::to_string(world));
  }
  try {
    torch::serialize::InputArchive ebm_ar, ebm_opt_ar;
    ar.read("ebm", ebm_ar);
    target_->net()->load(ebm_ar);
    ar.read("ebm_optimizer", ebm_opt_ar);
    ebm_opt_->load(ebm_opt_ar);
    if (sampler_trainer_) sampler_trainer_->load(ar, "sampler", "sampler_optimizer");
    torch::Tensor b, state;
    ar.read("buffer", b);
    const int64_t rows = buffer_.size(0);
    if (b.dim() != 2 || b.size(0) != rows * world || b.size(1) != buffer_.size(1)) {
      throw DataError("EBM checkpoint '" + path + "' has a buffer of the wrong shape");
    }
    buffer_ = b.narrow(0, comm_->rank() * rows, rows).to(buffer_.options());
    if (world > 1) {
      ar.read("rng_ranks", state);
      gen_.set_state(state[comm_->rank()].to(torch::kCPU).clone());
      ar.read("rng_cpu_ranks", state);
      cpu_gen_.set_state(state[comm_->rank()].to(torch::kCPU).clone());
    } else {
      ar.read("rng", state);
      gen_.set_state(state.to(torch::kCPU));
      ar.read("rng_cpu", state);
      cpu_gen_.set_state(state.to(torch::kCPU));
    }
  } catch (const c10::Error& e) {
    throw DataError("EBM checkpoint '" + path + "' is incomplete or corrupt: " + e.what_without_backtrace());
  }
  it_ = meta.at("iteration");
  updates_ = meta.at("updates");
  if (sampler_trainer_) sampler_trainer_->beta().set_value(meta.at("beta"));
  log_eps_mala_ = meta.at("log_eps_mala");
  if (mala_) mala_->set_step_size(std::exp(log_eps_mala_));
  grads_sampling_ = meta.at("grads_sampling");
  grads_training_ = meta.at("grads_training");
  elapsed_ = meta.at("elapsed");
  log_.clear();
  for (const auto& row : meta.at("log")) log_.push_back(ebm_stats_from_json(row));
}

json read_ebm_checkpoint_meta(const std::string& path) {
  json meta;
  open_ebm_archive(path, meta);
  return meta;
}

static const char* kEbmLogHeader =
    "iteration,accept,mcmc_accept,entropy,jump,energy_diff,eps,beta,lr,updates,grads_sampling,grads_training,seconds,elapsed";

void write_ebm_log(const std::string& path, const std::vector<EbmStats>& rows) {
  write_atomically(path, [&](std::ostream& os) {
    os << kEbmLogHeader << "\n";
    for (const auto& s : rows) {
      os << s.iteration << ',' << s.accept << ',' << s.mcmc_accept << ',' << s.entropy << ',' << s.jump << ','
         << s.energy_diff << ',' << s.eps << ',' << s.beta << ',' << s.lr << ',' << s.updates << ','
         << s.grads_sampling << ',' << s.grads_training << ',' << s.seconds << ',' << s.elapsed << "\n";
    }
  });
}

std::vector<EbmStats> read_ebm_log(const std::string& path) {
  std::string text = read_file(path);
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kEbmLogHeader) throw DataError("'" + path + "' is not an nmcmc EBM log");
  std::vector<EbmStats> rows;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<double> v;
    std::istringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) {
      try {
        v.push_back(std::stod(cell));
      } catch (const std::exception&) {
        v.push_back(NAN);  // "nan" / "-nan"
      }
    }
    if (v.size() != 14) throw DataError("'" + path + "': malformed row '" + line + "'");
    EbmStats s;
    s.iteration = static_cast<int64_t>(v[0]);
    s.accept = v[1];
    s.mcmc_accept = v[2];
    s.entropy = v[3];
    s.jump = v[4];
    s.energy_diff = v[5];
    s.eps = v[6];
    s.beta = v[7];
    s.lr = v[8];
    s.updates = static_cast<int64_t>(v[9]);
    s.grads_sampling = static_cast<int64_t>(v[10]);
    s.grads_training = static_cast<int64_t>(v[11]);
    s.seconds = v[12];
    s.elapsed = v[13];
    rows.push_back(s);
  }
  return rows;
}

}  // namespace nmcmc
