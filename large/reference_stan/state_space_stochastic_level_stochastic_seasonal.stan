// The reference program for uk_drivers-state_space_stochastic_level_stochastic_seasonal
// (scripts/large_reference.R): the same posterior as
// large/stan/state_space_stochastic_level_stochastic_seasonal.stan (posteriordb's), reparameterised
// for Stan's sampler in three ways, each with a unit Jacobian or the one the normal's scale takes:
// - the level's and the seasonal's random walks are non-centred: mu[t] = mu[t-1] + sigma[2] *
//   mu_raw[t-1] with mu_raw ~ normal(0, 1) is mu[t] ~ normal(mu[t-1], sigma[2]) (the Jacobian
//   sigma[2]^(n-1) is the normal's scale), and likewise the seasonal after its first 11 values,
//   which stay free (flat) as in the original;
// - the first level is given through level_raw = mu[1] + beta * mean(x), the fitted intercept:
//   x (the log petrol price) varies little, so mu[1] and beta move together along a ridge that
//   the centred program's chains crossed in hundreds of iterations (R-hat 1.26 over 2 x 1,000
//   draws); level_raw's bounds are mu[1]'s, shifted by beta * mean(x);
// - the original's bounds on every mu[t] are kept as the transformed parameter's: a draw outside
//   them is rejected, as the original's density is zero there. The posterior reaches the lower
//   bound, so Stan counts these rejections as divergent transitions (about 0.7 per draw in a
//   2 x 1,000 pilot); they end a trajectory where the density is zero and leave the draws exact.
// The *_raw variables are left out of the reference: mu, seasonal, beta, lambda, sigma and yhat are
// the quantities. Its random inits fall outside mu's bounds: state_space_...seasonal.init.R gives them.
data {
  int<lower=1> n;
  vector[n] y;
  vector[n] x;
  vector[n] w;
}
transformed data {
  real lo = mean(y) - 3 * sd(y);
  real hi = mean(y) + 3 * sd(y);
  real xbar = mean(x);
}
parameters {
  real beta;
  real<lower=lo + beta * xbar, upper=hi + beta * xbar> level_raw;
  vector[n - 1] mu_raw;
  vector[11] seasonal_init_raw;
  vector[n - 11] seasonal_raw;
  real lambda;
  positive_ordered[3] sigma;
}
transformed parameters {
  vector<lower=lo, upper=hi>[n] mu;
  vector[n] seasonal;
  vector[n] yhat;
  mu[1] = level_raw - beta * xbar;
  for (t in 2 : n) {
    mu[t] = mu[t - 1] + sigma[2] * mu_raw[t - 1];
  }
  seasonal[1 : 11] = seasonal_init_raw;
  for (t in 12 : n) {
    seasonal[t] = -sum(seasonal[t - 11 : t - 1]) + sigma[1] * seasonal_raw[t - 11];
  }
  yhat = mu + beta * x + lambda * w;
}
model {
  mu_raw ~ std_normal();
  seasonal_raw ~ std_normal();
  y ~ normal(yhat + seasonal, sigma[3]);
  sigma ~ student_t(4, 0, 1);
}
