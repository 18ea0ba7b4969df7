// posteriordb's eight_schools_noncentered (stan-dev/posteriordb, BSD-3; posteriordb/LICENCE.md),
// in the array syntax of Stan 2.21 (Debian's rstan).
data {
  int<lower=0> J;
  real y[J];
  real<lower=0> sigma[J];
}
parameters {
  vector[J] theta_trans;
  real mu;
  real<lower=0> tau;
}
transformed parameters {
  vector[J] theta;
  theta = theta_trans * tau + mu;
}
model {
  theta_trans ~ normal(0, 1);
  y ~ normal(theta, sigma);
  mu ~ normal(0, 5);
  tau ~ cauchy(0, 5);
}
