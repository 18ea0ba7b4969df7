// The reference program for uk_drivers-state_space_stochastic_level_stochastic_seasonal
// (scripts/large_reference.R): the same posterior as
// large/stan/state_space_stochastic_level_stochastic_seasonal.stan (posteriordb's), with the level's
// and the seasonal's random walks non-centred. mu[t] = mu[t-1] + sigma[2] * mu_raw[t-1] with
// mu_raw ~ normal(0, 1) is mu[t] ~ normal(mu[t-1], sigma[2]) (the Jacobian sigma[2]^(n-1) is the
// normal's scale), and likewise the seasonal after its first 11 values, which stay free as they are
// in the original (flat). The original's bounds on every mu[t] are kept as the transformed
// parameter's: a draw outside them is rejected, as the original's density is zero there. mu1_raw
// (the first level) and seasonal_init_raw (the first 11 seasonal values) are named *_raw only so
// that the reference leaves them out: mu[1] and seasonal[1:11] are the quantities.
data {
  int<lower=1> n;
  vector[n] y;
  vector[n] x;
  vector[n] w;
}
transformed data {
  real lo = mean(y) - 3 * sd(y);
  real hi = mean(y) + 3 * sd(y);
}
parameters {
  real<lower=lo, upper=hi> mu1_raw;
  vector[n - 1] mu_raw;
  vector[11] seasonal_init_raw;
  vector[n - 11] seasonal_raw;
  real beta;
  real lambda;
  positive_ordered[3] sigma;
}
transformed parameters {
  vector<lower=lo, upper=hi>[n] mu;
  vector[n] seasonal;
  vector[n] yhat;
  mu[1] = mu1_raw;
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
