// NUTS's engine, the batch: the chains' starting transitions and their leaves, one batched call of
// the target per round (Note [Batched NUTS], kernels/nuts.hpp).
#include "nuts_engine.hpp"

namespace nmcmc {
namespace nuts_engine {

Engine::Engine(Target& target, const Metric& metric, const NutsRules& rules, const NutsOptions& options,
       const std::vector<double>& eps, const ChainState& state, at::Generator& gen)
    : target_(target), metric64_(metric.to(torch::TensorOptions().dtype(torch::kFloat64).device(torch::kCPU))),
      elementwise_(metric.kind() == MetricKind::kUnit || metric.kind() == MetricKind::kDiag),
      single_(target.options().dtype() == torch::kFloat32), rules_(rules),
      inside_multinomial_(rule_is(rules.inside, multinomial_choice)), options_(options),
      c_(state.x.size(0)), d_(state.x.size(1)), chains_(c_) {
  TORCH_CHECK(single_ || target.options().dtype() == torch::kFloat64, "NUTS runs targets in float32 or float64");
  TORCH_CHECK(static_cast<int64_t>(eps.size()) == c_, "NUTS: ", eps.size(), " step sizes for ", c_, " chains");
  x_host_ = torch::empty({c_, d_}, torch::TensorOptions().dtype(single_ ? torch::kFloat32 : torch::kFloat64));
  minv_.assign(static_cast<size_t>(d_), 1.0);
  if (metric.kind() == MetricKind::kDiag) {
    const torch::Tensor m = metric64_.inv_mass().contiguous();
    TORCH_CHECK(m.numel() == d_, "NUTS: the metric is for ", m.numel(), " dimensions, the chains have ", d_);
    std::memcpy(minv_.data(), m.data_ptr<double>(), static_cast<size_t>(d_) * sizeof(double));
  }
  for (double m : minv_) sqrt_minv_.push_back(std::sqrt(m));
  torch::Tensor x = state.x.to(torch::kCPU, torch::kFloat64).contiguous();
  torch::Tensor g = state.grad.to(torch::kCPU, torch::kFloat64).contiguous();
  torch::Tensor e = state.energy.to(torch::kCPU, torch::kFloat64).contiguous();
  torch::Tensor seeds = rand({c_, 2}, gen, state.energy.options().dtype(torch::kFloat64)).cpu().contiguous();
  const double* xs = x.data_ptr<double>();
  const double* gs = g.data_ptr<double>();
  const double* es = e.data_ptr<double>();
  const double* ss = seeds.data_ptr<double>();
  const size_t d = static_cast<size_t>(d_);
  for (int64_t c = 0; c < c_; ++c) {
    Chain& ch = chains_[c];
    ch.eps = eps[static_cast<size_t>(c)];
    ch.rng.s = static_cast<uint64_t>(ss[2 * c] * 0x1.0p53) ^ (static_cast<uint64_t>(ss[2 * c + 1] * 0x1.0p53) << 11);
    ch.pool.init(d);
    ch.start = ch.pool.take();
    std::memcpy(ch.pool.x(ch.start), xs + c * d_, d * sizeof(double));
    std::memcpy(ch.pool.g(ch.start), gs + c * d_, d * sizeof(double));
    ch.pool[ch.start].energy = es[c];
    for (Vec* v : {&ch.rho, &ch.rho_fwd, &ch.rho_bck}) v->assign(d, 0.0);
    ch.stack.resize(static_cast<size_t>(options_.max_depth) + 1);
  }
}

void Engine::run(int64_t n, int64_t lookahead, const torch::Tensor& p0, const StepCallback& on_step) {
  for (Chain& ch : chains_) ch.done.resize(static_cast<size_t>(lookahead));
  int64_t emitted = 0;
  bool first = true;
  std::vector<int64_t> starting, live;
  while (emitted < n) {
    starting.clear();
    for (int64_t c = 0; c < c_; ++c) {
      Chain& ch = chains_[c];
      if (!ch.building && ch.started < n && ch.started - emitted < lookahead) starting.push_back(c);
    }
    if (!starting.empty()) begin(starting, first ? p0 : torch::Tensor());
    first = false;
    live.clear();
    for (int64_t c = 0; c < c_; ++c) {
      if (chains_[c].building) live.push_back(c);
    }
    if (!live.empty()) leaves(live);
    TORCH_CHECK(!starting.empty() || !live.empty() ||
                    std::all_of(chains_.begin(), chains_.end(), [](const Chain& ch) { return ch.done_count > 0; }),
                "NUTS: no chain can go on (internal error)");
    while (emitted < n && std::all_of(chains_.begin(), chains_.end(), [](const Chain& ch) { return ch.done_count > 0; })) {
      ++emitted;
      if (!hand_over(on_step)) return;
    }
  }
}

void Engine::begin(const std::vector<int64_t>& which, const torch::Tensor& given) {
  const int64_t k = static_cast<int64_t>(which.size());
  const size_t d = static_cast<size_t>(d_);
  if (given.defined()) {
    TORCH_CHECK(k == c_, "NUTS: given momenta need every chain to start");
    const torch::Tensor p0 = given.to(torch::kCPU, torch::kFloat64).contiguous();
    for (int64_t i = 0; i < k; ++i) {
      Chain& ch = chains_[which[i]];
      std::memcpy(ch.pool.p(ch.start), p0.data_ptr<double>() + i * d_, d * sizeof(double));
    }
  } else if (elementwise_) {  // p = M^{1/2} z, M^{1/2} = diag(1 / sqrt(M^{-1}))
    for (int64_t i = 0; i < k; ++i) {
      Chain& ch = chains_[which[i]];
      double* p = ch.pool.p(ch.start);
      for (size_t j = 0; j < d; ++j) p[j] = ch.rng.normal() / sqrt_minv_[j];
    }
  } else {
    torch::Tensor z = torch::empty({k, d_}, host());
    double* zs = z.data_ptr<double>();
    for (int64_t i = 0; i < k; ++i) {
      Stream& rng = chains_[which[i]].rng;
      for (int64_t j = 0; j < d_; ++j) zs[i * d_ + j] = rng.normal();
    }
    const torch::Tensor p0 = metric64_.momentum(z).contiguous();
    for (int64_t i = 0; i < k; ++i) {
      Chain& ch = chains_[which[i]];
      std::memcpy(ch.pool.p(ch.start), p0.data_ptr<double>() + i * d_, d * sizeof(double));
    }
  }
  velocities(which, [](Chain& ch) { return ch.pool.p(ch.start); }, [](Chain& ch) { return ch.pool.ps(ch.start); });
  for (int64_t i = 0; i < k; ++i) {
    Chain& ch = chains_[which[i]];
    Pool& pool = ch.pool;
    const int s = ch.start;
    ch.h0 = pool[s].energy + 0.5 * dot(pool.p(s), pool.ps(s), d);
    pool[s].h = ch.h0;
    for (int* end : {&ch.ends[0], &ch.ends[1], &ch.ff, &ch.fb, &ch.bf, &ch.bb, &ch.sample}) pool.set(*end, s);
    std::memcpy(ch.rho.data(), pool.p(s), d * sizeof(double));
    ch.log_w = 0;  // log exp(H0 - H0)
    ch.depth = 0;
    ch.n_leapfrog = 0;
    ch.sum_metro = 0;
    ch.divergent = false;
    ch.started += 1;
    begin_depth(ch, 0);
  }
}

template <typename From, typename To>
void Engine::velocities(const std::vector<int64_t>& which, From from, To to) {
  const int64_t k = static_cast<int64_t>(which.size());
  const size_t d = static_cast<size_t>(d_);
  if (elementwise_) {
    for (int64_t i = 0; i < k; ++i) {
      Chain& ch = chains_[which[i]];
      const double* v = from(ch);
      double* out = to(ch);
      for (size_t j = 0; j < d; ++j) out[j] = minv_[j] * v[j];
    }
    return;
  }
  torch::Tensor v = torch::empty({k, d_}, host());
  for (int64_t i = 0; i < k; ++i) std::memcpy(v.data_ptr<double>() + i * d_, from(chains_[which[i]]), d * sizeof(double));
  const torch::Tensor out = metric64_.velocity(v).contiguous();
  for (int64_t i = 0; i < k; ++i) std::memcpy(to(chains_[which[i]]), out.data_ptr<double>() + i * d_, d * sizeof(double));
}

void Engine::begin_depth(Chain& ch, int64_t d) {
  ch.d = d;
  ch.forward = ch.rng.uniform() > 0.5;
  // The old trajectory becomes the backward part (forward extension) or the forward part.
  if (ch.forward) {
    ch.rho_bck = ch.rho;
    std::fill(ch.rho_fwd.begin(), ch.rho_fwd.end(), 0.0);
    ch.pool.set(ch.bf, ch.ff);
  } else {
    ch.rho_fwd = ch.rho;
    std::fill(ch.rho_bck.begin(), ch.rho_bck.end(), 0.0);
    ch.pool.set(ch.fb, ch.bb);
  }
  ch.top = 0;
  ch.building = true;
}

template <typename G, typename E>
void Engine::kick_rows(const std::vector<int64_t>& live, const G* gs, const E* es) {
  const size_t d = static_cast<size_t>(d_);
  const double* minv = minv_.data();
  for (size_t i = 0; i < live.size(); ++i) {
    Chain& ch = chains_[live[i]];
    const int z = ch.head();
    const double half = 0.5 * (ch.forward ? ch.eps : -ch.eps);
    const G* gt = gs + i * d;
    double *p = ch.pool.p(z), *g = ch.pool.g(z);
    for (size_t j = 0; j < d; ++j) {
      g[j] = static_cast<double>(gt[j]);
      p[j] -= half * g[j];
    }
    ch.pool[z].energy = static_cast<double>(es[i]);
    if (elementwise_) {
      double* v = ch.pool.ps(z);
      for (size_t j = 0; j < d; ++j) v[j] = minv[j] * p[j];
      double two_k = 0;  // in order, one sum (H decides the multinomial weights: kept bit for bit)
      for (size_t j = 0; j < d; ++j) two_k += p[j] * v[j];
      ch.pool[z].h = ch.pool[z].energy + 0.5 * two_k;
    }
  }
}

void Engine::leaves(const std::vector<int64_t>& live) {
  if (single_) {
    leaves_as<float>(live);
  } else {
    leaves_as<double>(live);
  }
}

template <typename T>
void Engine::leaves_as(const std::vector<int64_t>& live) {
  const int64_t a = static_cast<int64_t>(live.size());
  const size_t d = static_cast<size_t>(d_);
  torch::Tensor xh = a == c_ ? x_host_ : x_host_.narrow(0, 0, a);
  T* xs = xh.data_ptr<T>();
  const double* minv = minv_.data();
  // Each chain's new leaf, its half kick p <- p - (eps/2) dU(x) from the head.
  for (int64_t i = 0; i < a; ++i) {
    Chain& ch = chains_[live[i]];
    Pool& pool = ch.pool;
    const int n = pool.take();
    const int h = ch.head();
    const double half = 0.5 * (ch.forward ? ch.eps : -ch.eps);
    const double *hp = pool.p(h), *hg = pool.g(h);
    double* np = pool.p(n);
    if (elementwise_) {  // with the drift x <- x + eps M^{-1} p in the same pass
      const double e = ch.forward ? ch.eps : -ch.eps;
      const double* hx = pool.x(h);
      double* nx = pool.x(n);
      T* row = xs + static_cast<size_t>(i) * d;
      for (size_t j = 0; j < d; ++j) {
        np[j] = hp[j] - half * hg[j];
        const T xt = static_cast<T>(hx[j] + e * (minv[j] * np[j]));
        nx[j] = static_cast<double>(xt);
        row[j] = xt;
      }
    } else {
      for (size_t j = 0; j < d; ++j) np[j] = hp[j] - half * hg[j];
    }
    ch.leaf_from = h;  // the head's hold is let go once the new leaf's position is written
    ch.head() = n;
  }
  if (!elementwise_) {  // the drift with M^{-1} p (into the new leaves' p# for now)
    velocities(live, [](Chain& ch) { return ch.pool.p(ch.head()); }, [](Chain& ch) { return ch.pool.ps(ch.head()); });
    for (int64_t i = 0; i < a; ++i) {
      Chain& ch = chains_[live[i]];
      const int n = ch.head();
      const double e = ch.forward ? ch.eps : -ch.eps;
      const double *hx = ch.pool.x(ch.leaf_from), *v = ch.pool.ps(n);
      double* nx = ch.pool.x(n);
      T* row = xs + static_cast<size_t>(i) * d;
      for (size_t j = 0; j < d; ++j) {
        const T xt = static_cast<T>(hx[j] + e * v[j]);
        nx[j] = static_cast<double>(xt);
        row[j] = xt;
      }
    }
  }
  for (int64_t i = 0; i < a; ++i) {
    Chain& ch = chains_[live[i]];
    ch.pool.drop(ch.leaf_from);
    ch.leaf_from = -1;
  }
  // A CPU target in the batch's dtype takes the batch as it is, and its U and dU are read in
  // place as it gives them (float32 or float64, converted to float64 exactly; any other dtype
  // converted first): at a call per leaf, each LibTorch conversion skipped is a few us of the
  // ~90 us a 64-chain leaf of Funnel-1 takes.
  const bool as_is = target_.options().device().is_cpu() && target_.options().dtype() == x_host_.dtype();
  const EnergyGrad eg = target_.energy_and_grad(as_is ? xh : xh.to(target_.options()));
  auto host_values = [](torch::Tensor t) {
    if (!t.device().is_cpu()) t = t.cpu();
    if (t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kFloat64) t = t.to(torch::kFloat64);
    return t.contiguous();
  };
  const torch::Tensor e1 = host_values(eg.energy), g1 = host_values(eg.grad);
  TORCH_CHECK(g1.numel() == a * d_ && e1.numel() == a, "NUTS: the target's gradient is not [", a, ", ", d_, "]");
  const bool g32 = g1.scalar_type() == torch::kFloat32, e32 = e1.scalar_type() == torch::kFloat32;
  if (g32 && e32) {
    kick_rows(live, g1.data_ptr<float>(), e1.data_ptr<float>());
  } else if (g32) {
    kick_rows(live, g1.data_ptr<float>(), e1.data_ptr<double>());
  } else if (e32) {
    kick_rows(live, g1.data_ptr<double>(), e1.data_ptr<float>());
  } else {
    kick_rows(live, g1.data_ptr<double>(), e1.data_ptr<double>());
  }
  if (!elementwise_) {
    velocities(live, [](Chain& ch) { return ch.pool.p(ch.head()); }, [](Chain& ch) { return ch.pool.ps(ch.head()); });
    for (int64_t i = 0; i < a; ++i) {
      Chain& ch = chains_[live[i]];
      const int z = ch.head();
      ch.pool[z].h = ch.pool[z].energy + 0.5 * dot(ch.pool.p(z), ch.pool.ps(z), d);
    }
  }
  for (int64_t i = 0; i < a; ++i) {
    Chain& ch = chains_[live[i]];
    const int z = ch.head();
    // A NaN or infinite H, or a point off to infinity whose energy is still finite: weight 0, divergent.
    const double* xz = ch.pool.x(z);
    if (!std::isfinite(ch.pool[z].h) || !std::all_of(xz, xz + d, [](double v) { return std::isfinite(v); }))
      ch.pool[z].h = kInf;
    leaf(ch, z);
  }
}

}  // namespace nuts_engine
}  // namespace nmcmc
