suppressPackageStartupMessages(library(rstan))
library(jsonlite)
d <- fromJSON("/work/main/inference_gym/data/brownian_motion_unknown_scales.json")
m <- stan_model(file="/work/main/inference_gym/stan/brownian_motion_unknown_scales.stan")
for (seed in 1:3) {
fit <- sampling(m, data=d, chains=4, iter=2000, warmup=1000, seed=seed, refresh=0, cores=1)
sp <- get_sampler_params(fit, inc_warmup=FALSE)
cat("seed", seed, "stepsizes", sapply(sp, function(x) x[1,"stepsize__"]), "grads/draw", mean(sapply(sp, function(x) mean(x[,"n_leapfrog__"]))), "div", sum(sapply(sp, function(x) sum(x[,"divergent__"]))), "\n")
}
