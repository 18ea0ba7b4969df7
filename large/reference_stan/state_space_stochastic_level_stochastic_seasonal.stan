// The reference program for uk_drivers-state_space_stochastic_level_stochastic_seasonal
// (scripts/large_reference.R): the same posterior as
// large/stan/state_space_stochastic_level_stochastic_seasonal.stan (posteriordb's), with the
// seasonal's random walk non-centred: seasonal[t] = -sum(seasonal[t-11:t-1]) + sigma[1] *
// seasonal_raw[t-11] with seasonal_raw ~ normal(0, 1) is seasonal[t] ~ normal(-sum(...), sigma[1])
// (the Jacobian sigma[1]^(n-11) is the normal's scale). Its first 11 values stay free, as they are
// in the original (flat); seasonal_init_raw is named *_raw only so that the reference leaves it out
// (seasonal[1:11] are the quantities). The level mu stays centred, with the original's bounds.
data {
  int<lower=1> n;
  vector[n] y;
  vector[n] x;
  vector[n] w;
}
parameters {
  vector<lower=mean(y) - 3 * sd(y), upper=mean(y) + 3 * sd(y)>[n] mu;
  vector[11] seasonal_init_raw;
  vector[n - 11] seasonal_raw;
  real beta;
  real lambda;
  positive_ordered[3] sigma;
}
transformed parameters {
  vector[n] seasonal;
  vector[n] yhat;
  seasonal[1 : 11] = seasonal_init_raw;
  for (t in 12 : n) {
    seasonal[t] = -sum(seasonal[t - 11 : t - 1]) + sigma[1] * seasonal_raw[t - 11];
  }
  yhat = mu + beta * x + lambda * w;
}
model {
  seasonal_raw ~ std_normal();
  for (t in 2 : n) {
    mu[t] ~ normal(mu[t - 1], sigma[2]);
  }
  y ~ normal(yhat + seasonal, sigma[3]);
  sigma ~ student_t(4, 0, 1);
}
