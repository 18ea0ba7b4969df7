// NUTS's engine, one chain's tree: a leaf taken in, subtrees merged with their U-turn checks, the
// transition chosen and handed over in order (Note [Batched NUTS], kernels/nuts.hpp).
#include "nuts_engine.hpp"

namespace nmcmc {
namespace nuts_engine {

void Engine::leaf(Chain& ch, int z) {
  Pool& pool = ch.pool;
  const double w = ch.h0 - pool[z].h;  // log weight
  const bool div = !(-w <= options_.max_delta_h);  // a NaN weight (H or H0 not finite) too
  ch.n_leapfrog += 1;
  ch.sum_metro += std::exp(std::min(w, 0.0));
  if (div) {
    ch.divergent = true;
    end_subtree(ch, false);
    return;
  }
  if (ch.top >= 1 && ch.stack[static_cast<size_t>(ch.top - 1)].level == 0) {
    // The second leaf of a pair: merged with the first without a node of its own.
    if (!merge_leaf(ch, ch.stack[static_cast<size_t>(ch.top - 1)], z, w)) {
      end_subtree(ch, false);
      return;
    }
  } else {
    // The first leaf of a pair (or the whole subtree at depth 0): its first leaf and its sample.
    Node& n = ch.stack[static_cast<size_t>(ch.top++)];
    n.level = 0;
    pool.set(n.beg, z);
    pool.set(n.sample, z);
    n.log_w = w;
  }
  while (ch.top >= 2 && ch.stack[ch.top - 1].level == ch.stack[ch.top - 2].level) {
    const bool valid = merge(ch, ch.stack[ch.top - 2], ch.stack[ch.top - 1]);
    ch.top -= 1;
    if (!valid) {
      end_subtree(ch, false);
      return;
    }
  }
  if (ch.top == 1 && ch.stack[0].level == ch.d) {
    Node& n = ch.stack[0];
    if (n.level == 0) {  // a one-leaf subtree: its end is its beginning
      pool.set(n.end, n.beg);
      n.rho.assign(pool.p(n.beg), pool.p(n.beg) + d_);
    }
    end_subtree(ch, true);
  }
}

bool Engine::merge_leaf(Chain& ch, Node& init, int z, double w) {
  Pool& pool = ch.pool;
  const size_t d = static_cast<size_t>(d_);
  const double log_w = log_add_exp(init.log_w, w);
  // Stan's multinomial choice is exp(w - log_w), log_w as just computed (the same operations).
  const double take = inside_multinomial_ ? std::exp(w - log_w) : rules_.inside(w, init.log_w);
  if (ch.rng.uniform() < take) pool.set(init.sample, z);
  const double *p1 = pool.p(init.beg), *p2 = pool.p(z);
  const bool persist = !rules_.check_inside || no_u_turn_pass<true>(sharp(ch, init.beg), sharp(ch, z), p1, p2, d);
  init.rho.resize(d);
  for (size_t j = 0; j < d; ++j) init.rho[j] = p1[j] + p2[j];
  pool.set(init.end, z);
  init.log_w = log_w;
  init.level = 1;
  return persist;
}

bool Engine::merge(Chain& ch, Node& init, Node& fin) {
  const size_t d = static_cast<size_t>(d_);
  const double log_w = log_add_exp(init.log_w, fin.log_w);
  const double take = inside_multinomial_ ? std::exp(fin.log_w - log_w) : rules_.inside(fin.log_w, init.log_w);
  if (ch.rng.uniform() < take) std::swap(init.sample, fin.sample);
  bool persist = !rules_.check_inside ||
                 no_u_turn_pass<true>(sharp(ch, init.beg), sharp(ch, fin.end), init.rho.data(), fin.rho.data(), d);
  persist = persist && (!rules_.check_inside ||
                        no_u_turn_pass<true>(sharp(ch, init.beg), sharp(ch, fin.beg), init.rho.data(), ch.pool.p(fin.beg), d));
  persist = persist && (!rules_.check_inside ||
                        no_u_turn_pass<true>(sharp(ch, init.end), sharp(ch, fin.end), fin.rho.data(), ch.pool.p(init.end), d));
  for (size_t j = 0; j < d; ++j) init.rho[j] += fin.rho[j];
  std::swap(init.end, fin.end);
  init.log_w = log_w;
  init.level += 1;
  release(ch, fin);
  return persist;
}

void Engine::release(Chain& ch, Node& n) {
  for (int* i : {&n.beg, &n.end, &n.sample}) ch.pool.set(*i, -1);
}

void Engine::end_subtree(Chain& ch, bool valid) {
  ch.building = false;
  if (!valid) {  // an invalid subtree ends the trajectory and is not used
    finish(ch);
    return;
  }
  Pool& pool = ch.pool;
  const size_t d = static_cast<size_t>(d_);
  Node& sub = ch.stack[0];
  if (ch.forward) {
    std::swap(ch.rho_fwd, sub.rho);
    pool.set(ch.fb, sub.beg);
    pool.set(ch.ff, sub.end);
  } else {
    std::swap(ch.rho_bck, sub.rho);
    pool.set(ch.bf, sub.beg);
    pool.set(ch.bb, sub.end);
  }
  ch.depth += 1;
  // Between the old trajectory and the new subtree (Stan: biased progressive sampling).
  if (ch.rng.uniform() < rules_.top_level(sub.log_w, ch.log_w)) std::swap(ch.sample, sub.sample);
  ch.log_w = log_add_exp(ch.log_w, sub.log_w);
  release(ch, sub);
  ch.top = 0;
  for (size_t j = 0; j < d; ++j) ch.rho[j] = ch.rho_bck[j] + ch.rho_fwd[j];
  // The U-turn criterion over the merged trajectory and across the seam.
  bool persist = !rules_.check_merged || no_u_turn_pass<false>(sharp(ch, ch.bb), sharp(ch, ch.ff), ch.rho.data(), nullptr, d);
  persist = persist && no_u_turn_pass<true>(sharp(ch, ch.bb), sharp(ch, ch.fb), ch.rho_bck.data(), pool.p(ch.fb), d);
  persist = persist && no_u_turn_pass<true>(sharp(ch, ch.bf), sharp(ch, ch.ff), ch.rho_fwd.data(), pool.p(ch.bf), d);
  if (persist && ch.d + 1 < options_.max_depth) {
    begin_depth(ch, ch.d + 1);
  } else {
    finish(ch);
  }
}

void Engine::finish(Chain& ch) {
  ch.building = false;
  Pool& pool = ch.pool;
  const size_t d = static_cast<size_t>(d_);
  Done& r = ch.done[static_cast<size_t>((ch.done_head + ch.done_count) % static_cast<int64_t>(ch.done.size()))];
  ch.done_count += 1;
  const int s = ch.sample;
  r.x.assign(pool.x(s), pool.x(s) + d);
  r.grad.assign(pool.g(s), pool.g(s) + d);
  r.energy = pool[s].energy;
  r.h = pool[s].h;
  const double accept = ch.sum_metro / static_cast<double>(ch.n_leapfrog);
  r.accept = std::isfinite(accept) ? std::clamp(accept, 0.0, 1.0) : 0.0;
  r.n_leapfrog = ch.n_leapfrog;
  r.depth = ch.depth;
  r.divergent = ch.divergent;
  r.moved = s != ch.start && !std::equal(pool.x(s), pool.x(s) + d, pool.x(ch.start));
  // Every leaf let go but the sample, where the next transition starts.
  for (int64_t t = 0; t < ch.top; ++t) release(ch, ch.stack[static_cast<size_t>(t)]);
  ch.top = 0;
  for (int* end : {&ch.ends[0], &ch.ends[1], &ch.ff, &ch.fb, &ch.bf, &ch.bb}) pool.set(*end, -1);
  pool.move(ch.start, s);
  ch.sample = -1;
}

bool Engine::hand_over(const StepCallback& on_step) {
  // On the CPU the tensors are made in their final dtype and filled in place (a draw of a cheap
  // target costs less than a dozen tensor conversions); on another device they are moved there.
  const torch::ScalarType xt = single_ ? torch::kFloat32 : torch::kFloat64;
  torch::Tensor x = torch::empty({c_, d_}, torch::TensorOptions().dtype(xt));
  torch::Tensor g = torch::empty({c_, d_}, torch::TensorOptions().dtype(xt));
  torch::Tensor e = torch::empty({c_}, host()), h = torch::empty({c_}, host()), acc = torch::empty({c_}, host());
  torch::Tensor nl = torch::empty({c_}, torch::kInt64), depth = torch::empty({c_}, torch::kInt64);
  torch::Tensor div = torch::empty({c_}, torch::kBool), moved = torch::empty({c_}, torch::kBool);
  double *es = e.data_ptr<double>(), *hs = h.data_ptr<double>(), *as = acc.data_ptr<double>();
  int64_t *ns = nl.data_ptr<int64_t>(), *ds = depth.data_ptr<int64_t>();
  bool *vs = div.data_ptr<bool>(), *ms = moved.data_ptr<bool>();
  const size_t d = static_cast<size_t>(d_);
  int64_t most = 0;
  for (int64_t c = 0; c < c_; ++c) {
    Chain& ch = chains_[c];
    const Done& r = ch.done[static_cast<size_t>(ch.done_head)];
    if (single_) {  // x and dU were float32 values (the target's): exact
      float *xr = x.data_ptr<float>() + c * d_, *gr = g.data_ptr<float>() + c * d_;
      for (size_t j = 0; j < d; ++j) {
        xr[j] = static_cast<float>(r.x[j]);
        gr[j] = static_cast<float>(r.grad[j]);
      }
    } else {
      std::memcpy(x.data_ptr<double>() + c * d_, r.x.data(), d * sizeof(double));
      std::memcpy(g.data_ptr<double>() + c * d_, r.grad.data(), d * sizeof(double));
    }
    es[c] = r.energy;
    hs[c] = r.h;
    as[c] = r.accept;
    ns[c] = r.n_leapfrog;
    ds[c] = r.depth;
    vs[c] = r.divergent;
    ms[c] = r.moved;
    most = std::max(most, r.n_leapfrog);
    ch.done_head = (ch.done_head + 1) % static_cast<int64_t>(ch.done.size());
    ch.done_count -= 1;
  }
  const torch::Device dev = target_.options().device();
  auto there = [&](const torch::Tensor& t) { return dev.is_cpu() ? t : t.to(dev); };
  last.x = x.to(target_.options());
  last.grad = g.to(target_.options());
  last.energy = there(e);
  StepInfo info;
  info.accept_prob = there(acc);
  info.accepted = there(moved);
  info.divergent = there(div);
  info.n_grad_chain = there(nl);
  info.n_grad = most;
  info.tree_depth = there(depth);
  info.energy = there(h);
  return on_step(last, info);
}

}  // namespace nuts_engine
}  // namespace nmcmc
