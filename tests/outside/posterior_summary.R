# The reference summary: R's posterior package (Debian's r-cran-posterior) on draw sets written by
# tests/outside/against_posterior.py. Usage: Rscript posterior_summary.R IN.json OUT.json
# IN.json: {"sets": {name: {"draws": [S][C][D], "names": [D]}}} ; OUT.json: per set and parameter
# mean, sd, mcse_mean, mcse_sd, q05, q50, q95, ess_bulk, ess_tail, rhat (null where posterior says NA).
suppressPackageStartupMessages({
  library(posterior)
  library(jsonlite)
})
args <- commandArgs(trailingOnly = TRUE)
input <- fromJSON(args[1], simplifyVector = FALSE)
out <- list(posterior_version = as.character(packageVersion("posterior")), sets = list())
for (name in names(input$sets)) {
  set <- input$sets[[name]]
  S <- length(set$draws)
  C <- length(set$draws[[1]])
  D <- length(set$draws[[1]][[1]])
  a <- array(unlist(lapply(set$draws, function(s) lapply(s, unlist))), dim = c(D, C, S))
  a <- aperm(a, c(3, 2, 1))  # [S, C, D]
  dimnames(a) <- list(iteration = NULL, chain = NULL, variable = unlist(set$names))
  x <- as_draws_array(a)
  s <- summarise_draws(x, mean, sd, mcse_mean, mcse_sd,
                       ~quantile2(.x, probs = c(0.05, 0.5, 0.95)), rhat, ess_bulk, ess_tail)
  out$sets[[name]] <- lapply(seq_len(nrow(s)), function(k) list(
    name = s$variable[k], mean = s$mean[k], sd = s$sd[k], mcse_mean = s$mcse_mean[k], mcse_sd = s$mcse_sd[k],
    q05 = s$q5[k], q50 = s$q50[k], q95 = s$q95[k], ess_bulk = s$ess_bulk[k], ess_tail = s$ess_tail[k],
    rhat = s$rhat[k]))
}
write(toJSON(out, auto_unbox = TRUE, digits = NA, na = "null", null = "null"), args[2])
