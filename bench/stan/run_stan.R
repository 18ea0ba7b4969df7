# Stan 2.21 (Debian's r-cran-rstan) on one model: compile, then sample `chains` chains one after
# another on one core, and write what the comparison needs as JSON.
# Usage: Rscript bench/stan/run_stan.R MODEL.stan DATA.json CHAINS WARMUP DRAWS SEED OUT.json
suppressMessages({library(rstan); library(jsonlite)})
a <- commandArgs(trailingOnly = TRUE)
model_file <- a[1]; data_file <- a[2]
chains <- as.integer(a[3]); warmup <- as.integer(a[4]); draws <- as.integer(a[5]); seed <- as.integer(a[6])
out <- a[7]
t0 <- Sys.time()
model <- stan_model(model_file, auto_write = FALSE)
compile_s <- as.numeric(difftime(Sys.time(), t0, units = "secs"))
data <- fromJSON(data_file)
if (length(data) == 0) data <- list()
t1 <- Sys.time()
fit <- sampling(model, data = data, chains = chains, iter = warmup + draws, warmup = warmup, seed = seed,
                cores = 1, refresh = 0, control = list(adapt_delta = 0.8))
wall_s <- as.numeric(difftime(Sys.time(), t1, units = "secs"))
el <- get_elapsed_time(fit)
sp <- get_sampler_params(fit, inc_warmup = FALSE)
spw <- get_sampler_params(fit, inc_warmup = TRUE)
leap <- sum(sapply(sp, function(s) sum(s[, "n_leapfrog__"])))
leap_all <- sum(sapply(spw, function(s) sum(s[, "n_leapfrog__"])))
arr <- as.array(fit)  # [draws, chains, parameters]
pars <- dimnames(arr)[[3]]
pars <- pars[pars != "lp__"]
ess <- sapply(pars, function(p) ess_bulk(arr[, , p]))
rhat <- sapply(pars, function(p) Rhat(arr[, , p]))
write(toJSON(list(model = basename(model_file), chains = chains, warmup = warmup, draws = draws, seed = seed,
                  compile_seconds = compile_s, wall_seconds = wall_s,
                  seconds_warmup = sum(el[, "warmup"]), seconds_sampling = sum(el[, "sample"]),
                  grads_sampling = leap, grads_total = leap_all,
                  min_ess_bulk = min(ess, na.rm = TRUE), max_rhat = max(rhat, na.rm = TRUE), ess_bulk = as.list(ess),
                  mean = as.list(sapply(pars, function(p) mean(arr[, , p]))),
                  sd = as.list(sapply(pars, function(p) sd(arr[, , p]))),
                  divergences = sum(sapply(sp, function(s) sum(s[, "divergent__"])))),
              auto_unbox = TRUE, digits = NA), out)
