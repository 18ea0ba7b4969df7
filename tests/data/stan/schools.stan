// posteriordb's eight_schools_noncentered (stan-dev/posteriordb, BSD-3-Clause; see
// posteriordb/LICENCE.md) in current Stan syntax, with a generated quantity that draws random
// numbers: the tests' Stan program (tests/unit/test_stan.cpp, tests/cli/test_cli.cpp).
data {
  int<lower=0> J;
  array[J] real y;
  array[J] real<lower=0> sigma;
}
parameters {
  vector[J] theta_trans;
  real mu;
  real<lower=0> tau;
}
transformed parameters {
  vector[J] theta = theta_trans * tau + mu;
}
model {
  theta_trans ~ normal(0, 1);
  y ~ normal(theta, sigma);
  mu ~ normal(0, 5);
  tau ~ cauchy(0, 5);
}
generated quantities {
  array[J] real y_rep = normal_rng(theta, sigma);
}
