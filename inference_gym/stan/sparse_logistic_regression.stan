// Inference Gym's sparse logistic regression (TensorFlow Probability,
// spinoffs/inference_gym/inference_gym/tools/stan/sparse_logistic_regression.py; Apache-2.0,
// inference_gym/LICENCE.md), without its generated quantities
data {
  int<lower=0> num_train_points;
  int<lower=0> num_features;
  matrix[num_train_points,num_features] train_features;
  int<lower=0,upper=1> train_labels[num_train_points];
}
parameters {
  vector[num_features] unscaled_weights;
  vector<lower=0>[num_features] local_scales;
  real<lower=0> global_scale;
}
model {
  {
    vector[num_features] weights;
    vector[num_train_points] logits;

    weights = unscaled_weights .* local_scales * global_scale;
    logits = train_features * weights;

    unscaled_weights ~ normal(0, 1);
    local_scales ~ gamma(0.5, 0.5);
    global_scale ~ gamma(0.5, 0.5);
    train_labels ~ bernoulli_logit(logits);
  }
}
