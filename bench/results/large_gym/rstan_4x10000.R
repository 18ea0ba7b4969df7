suppressPackageStartupMessages(library(rstan))
library(jsonlite)
d <- fromJSON("/work/main/inference_gym/data/brownian_motion_unknown_scales.json")
fit <- stan(file="/work/main/inference_gym/stan/brownian_motion_unknown_scales.stan", data=d, chains=4, iter=12000, warmup=2000, seed=1, refresh=0, cores=1)
s <- summary(fit)$summary
print(s[c("innovation_noise_scale","observation_noise_scale","loc[12]"), c("mean","se_mean","sd","n_eff","Rhat")])
sp <- get_sampler_params(fit, inc_warmup=FALSE)
cat("divergences", sum(sapply(sp, function(x) sum(x[,"divergent__"]))), "\n")
