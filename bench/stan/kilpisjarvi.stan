// posteriordb's kilpisjarvi (stan-dev/posteriordb, BSD-3; posteriordb/LICENCE.md): a linear
// regression whose two coefficients are correlated near -1.
data {
  int<lower=0> N;
  vector[N] x;
  vector[N] y;
  real xpred;
  real pmualpha;
  real psalpha;
  real pmubeta;
  real psbeta;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> sigma;
}
model {
  alpha ~ normal(pmualpha, psalpha);
  beta ~ normal(pmubeta, psbeta);
  y ~ normal(alpha + beta * x, sigma);
}
