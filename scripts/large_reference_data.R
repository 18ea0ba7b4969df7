# Writes the data a reference program under large/reference_stan/ samples with (its MODEL.data.R's
# reference_data(data); the data as it is where the program has none) as JSON, so that nmcmc's
# samplers can run the same program: `scripts/posteriordb.py check --suite large --only POSTERIOR
# --program large/reference_stan/MODEL.stan --data OUT`.
# Usage: Rscript scripts/large_reference_data.R MODEL DATA OUT
suppressMessages(library(jsonlite))
a <- commandArgs(trailingOnly = TRUE)
if (length(a) != 3) stop("usage: Rscript scripts/large_reference_data.R MODEL DATA OUT")
root <- file.path(dirname(sub("--file=", "", grep("--file=", commandArgs(FALSE), value = TRUE))), "..", "large")
data <- fromJSON(file.path(root, "data", paste0(a[2], ".json")))
data_file <- file.path(root, "reference_stan", paste0(a[1], ".data.R"))
if (file.exists(data_file)) {
  source(data_file, local = TRUE)
  data <- reference_data(data)
}
write(toJSON(data, auto_unbox = TRUE, digits = NA), a[3])
