// Funnel-3 as nmcmc's `--target funnel --dim 20 --sigma 3`: x0 ~ N(0, 3^2), the other 19
// coordinates N(0, exp(-x0)) given x0 (src/targets/funnel_moon.cpp).
parameters {
  real x0;
  vector[19] rest;
}
model {
  x0 ~ normal(0, 3);
  rest ~ normal(0, exp(-x0 / 2));
}
