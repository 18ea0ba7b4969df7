/* nmcmc's C interface to a compiled Stan program (Note [Stan programs], targets/stan.hpp).
 *
 * stan/shim.cpp implements it around the C++ that Stan's compiler writes for one program; the two
 * are built together into a shared library that targets/stan.cpp loads with dlopen. The interface
 * is plain C so that the library and nmcmc need not share a C++ standard library or Stan's headers.
 *
 * Conventions: a function returning int returns 0 on success; on failure it returns non-zero and,
 * if `error` is not NULL, sets *error to a message that the caller frees with
 * nmcmc_stan_free_error. Vectors are float64. The unconstrained vector has
 * nmcmc_stan_dims(...).unconstrained entries; a constrained one has as many as the names list of
 * nmcmc_stan_names for the same include flags. A model is safe to use from several threads at once. */
#ifndef NMCMC_TARGETS_STAN_ABI_H
#define NMCMC_TARGETS_STAN_ABI_H

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this interface; a library built for another version is rebuilt. */
#define NMCMC_STAN_ABI_VERSION 1

typedef struct nmcmc_stan_model nmcmc_stan_model;

/* The library is built with hidden visibility: only these functions are exported. */
#if defined(__GNUC__)
#define NMCMC_STAN_API __attribute__((visibility("default")))
#else
#define NMCMC_STAN_API
#endif

NMCMC_STAN_API int nmcmc_stan_abi_version(void);
/* The Stan version the library was built against, e.g. "2.21.0". */
NMCMC_STAN_API const char* nmcmc_stan_version(void);

/* A model with its data, given as the text of a JSON object as CmdStan reads it ("{}" or "" for a
 * program without data). `seed` seeds the transformed data block's random numbers. NULL on failure. */
NMCMC_STAN_API nmcmc_stan_model* nmcmc_stan_new(const char* data_json, unsigned int seed, char** error);
NMCMC_STAN_API void nmcmc_stan_free(nmcmc_stan_model* model);
NMCMC_STAN_API void nmcmc_stan_free_error(char* error);

/* The model's name (Stan's class name). */
NMCMC_STAN_API const char* nmcmc_stan_name(const nmcmc_stan_model* model);
/* Dimensions: unconstrained parameters, and the constrained outputs without and with the
 * transformed parameters and generated quantities. */
NMCMC_STAN_API int nmcmc_stan_dims(const nmcmc_stan_model* model, int* unconstrained, int* params, int* params_tp,
                    int* params_tp_gq);
/* Comma-separated names in Stan's output order ("theta.1,theta.2,tau"): the constrained ones
 * (parameters, then transformed parameters and generated quantities as asked), or with
 * unconstrained = 1 the unconstrained ones. Owned by the model. */
NMCMC_STAN_API const char* nmcmc_stan_names(const nmcmc_stan_model* model, int unconstrained, int include_tp, int include_gq);

/* log density at the unconstrained point x (constants dropped as Stan's `~` drops them when
 * propto = 1; the log-Jacobian of the constraining transform added when jacobian = 1) and, when
 * grad is not NULL, its gradient. A density that raises (a domain error) returns non-zero. */
NMCMC_STAN_API int nmcmc_stan_log_density(const nmcmc_stan_model* model, int propto, int jacobian, const double* x, double* lp,
                           double* grad, char** error);

/* The constrained values at x: parameters, then transformed parameters and generated quantities
 * as asked; `rng_seed` seeds the generated quantities' random numbers. */
NMCMC_STAN_API int nmcmc_stan_constrain(const nmcmc_stan_model* model, int include_tp, int include_gq, const double* x,
                         unsigned long long rng_seed, double* out, char** error);

/* The unconstrained point of constrained parameter values (in nmcmc_stan_names(0, 0, 0) order). */
NMCMC_STAN_API int nmcmc_stan_unconstrain(const nmcmc_stan_model* model, const double* constrained, double* x, char** error);

#ifdef __cplusplus
}
#endif
#endif
