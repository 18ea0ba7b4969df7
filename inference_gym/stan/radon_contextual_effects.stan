// Inference Gym's radon contextual effects (TensorFlow Probability,
// spinoffs/inference_gym/inference_gym/tools/stan/radon_contextual_effects.py; Apache-2.0,
// inference_gym/LICENCE.md), its fitted means a local of the model block
data {
  int<lower=0> num_counties;
  int<lower=0> num_train;
  array[num_train] int<lower=0, upper=num_counties - 1> county;
  vector[num_train] log_uranium;
  vector[num_train] which_floor;
  vector[num_train] floor_by_county;
  vector[num_train] log_radon;
}
parameters {
  vector[num_counties] county_effect;
  vector[3] weight;
  real county_effect_mean;
  real<lower=0, upper=100> county_effect_scale;
  real<lower=0, upper=100> log_radon_scale;
}
model {
  vector[num_train] log_radon_mean;
  for (i in 1:num_train)
    log_radon_mean[i] = county_effect[county[i] + 1]
                        + log_uranium[i] * weight[1]
                        + which_floor[i] * weight[2]
                        + floor_by_county[i] * weight[3];
  county_effect_mean ~ normal(0, 1);
  county_effect ~ normal(county_effect_mean, county_effect_scale);
  weight ~ normal(0, 1);
  log_radon ~ normal(log_radon_mean, log_radon_scale);
}
