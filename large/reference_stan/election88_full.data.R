# The data of the reference program of the same name (scripts/large_reference.R sources a
# MODEL.data.R beside MODEL.stan and samples with reference_data(data)): election88_full's 11,566
# voters fall into 1,458 cells of identical covariates (age, education, state, black, female; the
# age-by-education cell, the region and the previous vote follow from them). Every voter in a cell
# has the same probability, so the cell's Bernoulli terms multiply to a binomial term up to a
# constant: the same posterior, with an eighth of the likelihood's terms.
reference_data <- function(data) {
  cell <- data.frame(age = data$age, edu = data$edu, age_edu = data$age_edu, state = data$state,
                     region_full = data$region_full, black = data$black, female = data$female,
                     v_prev_full = data$v_prev_full)
  key <- do.call(paste, c(cell, sep = ":"))
  first <- !duplicated(key)
  cells <- cell[first, ]
  index <- match(key, key[first])
  trials <- tabulate(index, nbins = nrow(cells))
  successes <- as.vector(tapply(data$y, factor(index, levels = seq_len(nrow(cells))), sum))
  c(list(M = nrow(cells), n_age = data$n_age, n_age_edu = data$n_age_edu, n_edu = data$n_edu,
         n_region_full = data$n_region_full, n_state = data$n_state),
    lapply(as.list(cells), function(v) as.vector(v)),
    list(trials = as.integer(trials), successes = as.integer(successes)))
}
