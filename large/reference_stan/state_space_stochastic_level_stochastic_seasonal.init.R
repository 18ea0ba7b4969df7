# Initial values for the reference program of the same name (scripts/large_reference.R sources a
# MODEL.init.R beside MODEL.stan): Stan's random inits (uniform on (-2, 2) unconstrained) put the
# non-centred level far outside its bounds. Each chain starts near a flat level with small scales,
# jittered by its own seed.
reference_init <- function(chain_id, data) {
  set.seed(1000 + chain_id)
  list(level_raw = mean(data$y) - 0.2 + rnorm(1, 0, 0.05), beta = rnorm(1, 0, 0.01),
       mu_raw = rnorm(data$n - 1, 0, 0.1), seasonal_init_raw = rnorm(11, 0, 0.05),
       seasonal_raw = rnorm(data$n - 11, 0, 0.1), lambda = rnorm(1, 0, 0.1), sigma = sort(runif(3, 0.01, 0.1)))
}
