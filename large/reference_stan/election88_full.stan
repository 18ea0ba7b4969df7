// The reference program for election88-election88_full (scripts/large_reference.R): the same posterior
// as large/stan/election88_full.stan (posteriordb's election88_full), non-centred in the four
// effects with few groups (age 4, education 4, age by education 16, region 5), whose scales the
// data barely inform: a = sigma_a * a_raw with a_raw ~ normal(0, 1) is a ~ normal(0, sigma_a), so
// (a, ..., sigma_e) have the same joint distribution. The states' effects d stay centred. The
// linear predictor is one vectorised expression (y_hat's loop in the original). The *_raw
// variables are not quantities of the posterior and are left out of the reference. The voters come
// in cells of identical covariates (election88_full.data.R): each cell's Bernoulli terms are one
// binomial term, the same posterior up to a constant with an eighth of the likelihood's terms.
data {
  int<lower=0> M;
  int<lower=0> n_age;
  int<lower=0> n_age_edu;
  int<lower=0> n_edu;
  int<lower=0> n_region_full;
  int<lower=0> n_state;
  array[M] int<lower=0, upper=n_age> age;
  array[M] int<lower=0, upper=n_edu> edu;
  array[M] int<lower=0, upper=n_age_edu> age_edu;
  array[M] int<lower=0, upper=n_state> state;
  array[M] int<lower=0, upper=n_region_full> region_full;
  vector<lower=0, upper=1>[M] black;
  vector<lower=0, upper=1>[M] female;
  vector[M] v_prev_full;
  array[M] int<lower=1> trials;
  array[M] int<lower=0> successes;
}
parameters {
  vector[n_age] a_raw;
  vector[n_edu] b_raw;
  vector[n_age_edu] c_raw;
  vector[n_state] d;
  vector[n_region_full] e_raw;
  vector[5] beta;
  real<lower=0, upper=100> sigma_a;
  real<lower=0, upper=100> sigma_b;
  real<lower=0, upper=100> sigma_c;
  real<lower=0, upper=100> sigma_d;
  real<lower=0, upper=100> sigma_e;
}
transformed parameters {
  vector[n_age] a = sigma_a * a_raw;
  vector[n_edu] b = sigma_b * b_raw;
  vector[n_age_edu] c = sigma_c * c_raw;
  vector[n_region_full] e = sigma_e * e_raw;
}
model {
  a_raw ~ normal(0, 1);
  b_raw ~ normal(0, 1);
  c_raw ~ normal(0, 1);
  d ~ normal(0, sigma_d);
  e_raw ~ normal(0, 1);
  beta ~ normal(0, 100);
  successes ~ binomial_logit(trials, beta[1] + beta[2] * black + beta[3] * female + beta[5] * (female .* black)
                                  + beta[4] * v_prev_full + a[age] + b[edu] + c[age_edu] + d[state] + e[region_full]);
}
