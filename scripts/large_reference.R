# A reference posterior for one of large/'s Stan programs, made with Stan 2.21 (Debian's r-cran-rstan),
# independent of nmcmc's own samplers (the program in Stan 2.21's syntax by `nmcmc stan-syntax`, $NMCMC_CLI
# or build/nmcmc): CHAINS chains of WARMUP + DRAWS iterations (adapt_delta ADAPT_DELTA), two at a
# time; every quantity's mean, sd, bulk- and tail-ESS, MCSE of the mean, R-hat, kurtosis, and 5, 25,
# 50, 75 and 95 % quantiles with their MCSEs by R's posterior package, written to
# large/stan_reference/POSTERIOR.json in posteriordb/'s layout (names as
# nmcmc writes them: theta[1,2] -> theta.1.2). It refuses to write a reference whose R-hat exceeds
# 1.01 or whose bulk-ESS is under 2,000 for any quantity. A program of the same name under
# large/reference_stan/ (the same posterior written for Stan's sampler) is sampled instead of
# large/stan/'s, with MODEL.data.R's data and MODEL.init.R's initial values where they exist.
# Usage: Rscript scripts/large_reference.R POSTERIOR MODEL DATA CHAINS WARMUP DRAWS ADAPT_DELTA SEED [METRIC [THIN]]
# (METRIC: Stan's diag_e, the default, or dense_e; THIN: keep every THIN-th of the DRAWS, 1 by
# default. R holds every kept draw three or four times over while it gathers and summarises them:
# ovarian's horseshoe, 4,719 quantities at 10 x 15,000 draws, went past 24 GB and was killed, so
# a posterior with thousands of quantities and a slow chain keeps every 4th or 5th draw, which
# costs its slowest quantities almost no effective draws.)
suppressMessages({library(rstan); library(jsonlite); library(posterior)})
a <- commandArgs(trailingOnly = TRUE)
if (!(length(a) %in% 8:10)) stop("usage: Rscript scripts/large_reference.R POSTERIOR MODEL DATA CHAINS WARMUP DRAWS ADAPT_DELTA SEED [METRIC [THIN]]")
metric <- if (length(a) >= 9) a[9] else "diag_e"
if (!(metric %in% c("diag_e", "dense_e"))) stop("METRIC must be diag_e or dense_e")
thin <- if (length(a) == 10) suppressWarnings(as.integer(a[10])) else 1L
if (is.na(thin) || thin < 1) stop("THIN must be a whole number of at least 1")
posterior <- a[1]; model_name <- a[2]; data_name <- a[3]
chains <- as.integer(a[4]); warmup <- as.integer(a[5]); draws <- as.integer(a[6])
adapt_delta <- as.numeric(a[7]); seed <- as.integer(a[8])
root <- file.path(dirname(sub("--file=", "", grep("--file=", commandArgs(FALSE), value = TRUE))), "..", "large")
cli <- Sys.getenv("NMCMC_CLI", file.path(root, "..", "build", "nmcmc"))
# A program under reference_stan/ is the same posterior reparameterised for Stan's sampler (its first
# comment says how); its standardised variables (NAME_raw) are not quantities of the posterior.
program_file <- file.path(root, "reference_stan", paste0(model_name, ".stan"))
if (!file.exists(program_file)) program_file <- file.path(root, "stan", paste0(model_name, ".stan"))
program <- system2(cli, c("stan-syntax", program_file), stdout = TRUE)
if (!is.null(attr(program, "status"))) stop("nmcmc stan-syntax failed")
# Debian's r-cran-bh holds no headers of its own (libboost-dev's are in /usr/include): rstan, looking
# for BH's, would stop with "Boost not found"
boost <- system.file("include", package = "BH")
if (!dir.exists(boost)) boost <- "/usr/include"
model <- stan_model(model_code = paste(program, collapse = "\n"), model_name = model_name, auto_write = FALSE,
                    boost_lib = boost)
data <- fromJSON(file.path(root, "data", paste0(data_name, ".json")))
# A reference program that takes its data in another form (the same posterior) has MODEL.data.R
# beside it, defining reference_data(data): the data it samples with.
data_file <- file.path(root, "reference_stan", paste0(model_name, ".data.R"))
if (file.exists(data_file)) {
  source(data_file, local = TRUE)
  data <- reference_data(data)
}
# A reference program whose random inits fail has MODEL.init.R beside it, defining
# reference_init(chain_id, data): each chain's initial values.
init <- "random"
init_file <- file.path(root, "reference_stan", paste0(model_name, ".init.R"))
if (file.exists(init_file)) {
  source(init_file, local = TRUE)
  init <- function(chain_id) reference_init(chain_id, data)
}
t1 <- Sys.time()
fit <- sampling(model, data = data, chains = chains, iter = warmup + draws, warmup = warmup, seed = seed,
                thin = thin, save_warmup = FALSE, cores = 2, refresh = max(1, (warmup + draws) %/% 5), init = init, control = list(adapt_delta = adapt_delta, metric = metric))
seconds <- as.numeric(difftime(Sys.time(), t1, units = "secs"))
arr <- as_draws_array(as.array(fit))
sp <- get_sampler_params(fit, inc_warmup = FALSE)
# The fit holds a second copy of every draw (at 3,075 parameters and 10 x 15,000 draws, 6 GB):
# gone before the summaries, which copy the draws once more.
rm(fit); invisible(gc())
arr <- subset_draws(arr, variable = variables(arr)[variables(arr) != "lp__" & !grepl("_raw(\\[|$)", variables(arr))])
# The quantiles and their MCSEs (posterior's mcse_quantile) let the checks compare quantities whose
# tails are too heavy for their sd's standard error to mean much (Note [Heavy tails] in
# scripts/posteriordb.py); the kurtosis goes into that standard error where the sd is checked.
probs <- c(0.05, 0.25, 0.5, 0.75, 0.95)
kurtosis <- function(x) { d <- x - mean(x); mean(d^4) / mean(d^2)^2 }
s <- summarise_draws(arr, mean, sd, ess_bulk, ess_tail, mcse_mean, rhat, kurtosis,
                     ~quantile2(.x, probs = probs), ~mcse_quantile(.x, probs = probs))
kept <- niterations(arr) * nchains(arr)  # the draws kept after thinning
divergent <- sum(sapply(sp, function(x) sum(x[, "divergent__"])))
names <- gsub("\\]", "", gsub("[[,]", ".", s$variable))
varying <- s$sd > 0
cat(sprintf("%s: %d quantities, %.0f s; max R-hat %.4f, min bulk-ESS %.0f, %d divergent\n", posterior, nrow(s),
            seconds, max(s$rhat[varying], na.rm = TRUE), min(s$ess_bulk[varying], na.rm = TRUE), divergent))
if (max(s$rhat[varying], na.rm = TRUE) > 1.01 || min(s$ess_bulk[varying], na.rm = TRUE) < 2000) {
  # What would have to run longer: the ten quantities with the least bulk-ESS and with the largest R-hat.
  worst <- s[varying, c("variable", "mean", "sd", "ess_bulk", "rhat")]
  print(as.data.frame(head(worst[order(worst$ess_bulk), ], 10)))
  print(as.data.frame(head(worst[order(-worst$rhat), ], 10)))
  stop("not written: R-hat above 1.01 or bulk-ESS under 2,000 (run longer)")
}
ref <- list(posterior = posterior, model = model_name, data = data_name,
            source = paste0("stan-dev/posteriordb posterior_database/posteriors/", posterior, ".json; reference made by ",
                            "scripts/large_reference.R from large/", basename(dirname(program_file)), "/",
                            basename(program_file)),
            inference = list(method = "stan_sampling (rstan 2.21, Debian)",
                             method_arguments = list(chains = chains, warmup = warmup, iter = warmup + draws,
                                                     seed = seed, thin = thin, control = list(adapt_delta = adapt_delta, metric = metric)),
                             seconds = seconds, divergent = divergent,
                             max_rhat = max(s$rhat[varying], na.rm = TRUE),
                             min_ess_bulk = min(s$ess_bulk[varying], na.rm = TRUE)),
            names = names, mean = s$mean, sd = s$sd, n = kept,
            ess_bulk = ifelse(varying, s$ess_bulk, kept), mcse_mean = ifelse(varying, s$mcse_mean, 0),
            rhat = ifelse(varying, s$rhat, 1), ess_tail = ifelse(varying, s$ess_tail, kept),
            kurtosis = ifelse(varying, s$kurtosis, 0))
for (p in probs) {  # q05, ..., q95 as nmcmc's summary names them; mcse_q05, ... (0 for a constant)
  key <- sprintf("q%02d", round(100 * p))
  ref[[key]] <- s[[sprintf("q%d", round(100 * p))]]
  ref[[paste0("mcse_", key)]] <- ifelse(varying, s[[sprintf("mcse_q%d", round(100 * p))]], 0)
}
dir.create(file.path(root, "stan_reference"), showWarnings = FALSE)
write(toJSON(ref, auto_unbox = TRUE, digits = NA, pretty = TRUE), file.path(root, "stan_reference", paste0(posterior, ".json")))
