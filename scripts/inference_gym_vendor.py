#!/usr/bin/python3
"""Vendors Inference Gym posteriors (TensorFlow Probability's spinoffs/inference_gym, Apache-2.0)
into inference_gym/: the Stan program, its data and the published ground truth, in the layout of
posteriordb/ (stan/, data/, stan_reference/), so that `scripts/posteriordb.py check --suite gym`
samples them as it does posteriordb's Stan programs.

    scripts/inference_gym_vendor.py TFP_CHECKOUT POSTERIORDB_CHECKOUT

TFP_CHECKOUT: a checkout (or `git archive`) of tensorflow/probability holding
spinoffs/inference_gym/inference_gym/{targets/ground_truth,internal/datasets,tools/stan}.
POSTERIORDB_CHECKOUT: one of stan-dev/posteriordb holding posterior_database/data/data-raw/radon
(Gelman and Hill's srrs2.dat and cty.dat, zipped: the radon survey Inference Gym loads through
tensorflow_datasets, rebuilt here as internal/data.py's `radon` does). Nothing is downloaded. The ground truth is the mean, sd and the mean's standard error of each constrained
quantity from long Stan runs (the files name the command); the reference's effective sample size
is taken as (sd / standard error)^2.
"""
import json
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "inference_gym")

# posterior name: (ground-truth module, dataset module or None, Stan program name, the ground
# truth's quantities in the program's order: (key, Stan name, scalar))
POSTERIORS = {
    "brownian_motion_unknown_scales": ("brownian_motion_unknown_scales_missing_middle_observations",
                                       "brownian_motion_missing_middle_observations",
                                       "brownian_motion_unknown_scales",
                                       [("INNOVATION_NOISE_SCALE", "innovation_noise_scale", True),
                                        ("OBSERVATION_NOISE_SCALE", "observation_noise_scale", True),
                                        ("LOCS", "loc", False)]),
    "german_credit_sparse_logistic_regression": ("german_credit_numeric_sparse_logistic_regression", None,
                                                 "sparse_logistic_regression",
                                                 [("UNSCALED_WEIGHTS", "unscaled_weights", False),
                                                  ("LOCAL_SCALES", "local_scales", False),
                                                  ("GLOBAL_SCALE", "global_scale", True)]),
    "radon_contextual_effects_minnesota": ("radon_contextual_effects_minnesota", "radon",
                                           "radon_contextual_effects",
                                           [("COUNTY_EFFECT", "county_effect", False),
                                            ("WEIGHT", "weight", False),
                                            ("COUNTY_EFFECT_MEAN", "county_effect_mean", True),
                                            ("COUNTY_EFFECT_SCALE", "county_effect_scale", True),
                                            ("LOG_RADON_SCALE", "log_radon_scale", True)]),
}
UCI_GERMAN = os.path.join(HERE, "..", "data", "uci", "german.data-numeric")

STAN = {
    # tools/stan/brownian_motion.py, brownian_motion_unknown_scales, as published (Stan 2.21 syntax)
    "brownian_motion_unknown_scales": """// Inference Gym's Brownian motion with unknown scales (TensorFlow Probability,
// spinoffs/inference_gym/inference_gym/tools/stan/brownian_motion.py; Apache-2.0, inference_gym/LICENCE.md)
data {
  int<lower=0> num_timesteps;
  int<lower=0> num_observations;
  int<lower = 1, upper = num_timesteps> observation_indices[num_observations];
  vector[num_observations] observations;
}
parameters {
  real<lower=0> innovation_noise_scale;
  real<lower=0> observation_noise_scale;
  vector[num_timesteps] loc;
}
model {
  innovation_noise_scale ~ lognormal(0, 2);
  observation_noise_scale ~ lognormal(0, 2);
  loc[1] ~ normal(0, innovation_noise_scale);
  for (t in 2:num_timesteps){
    loc[t] ~ normal(loc[t-1], innovation_noise_scale);
  }
  observations ~ normal(loc[observation_indices], observation_noise_scale);
}
""",
    # tools/stan/sparse_logistic_regression.py's model block as published; its generated quantities
    # (test-set log likelihoods; the ground truth uses no test set) are left out
    "sparse_logistic_regression": """// Inference Gym's sparse logistic regression (TensorFlow Probability,
// spinoffs/inference_gym/inference_gym/tools/stan/sparse_logistic_regression.py; Apache-2.0,
// inference_gym/LICENCE.md), without its generated quantities
data {
  int<lower=0> num_train_points;
  int<lower=0> num_features;
  matrix[num_train_points,num_features] train_features;
  int<lower=0,upper=1> train_labels[num_train_points];
}
parameters {
  vector[num_features] unscaled_weights;
  vector<lower=0>[num_features] local_scales;
  real<lower=0> global_scale;
}
model {
  {
    vector[num_features] weights;
    vector[num_train_points] logits;

    weights = unscaled_weights .* local_scales * global_scale;
    logits = train_features * weights;

    unscaled_weights ~ normal(0, 1);
    local_scales ~ gamma(0.5, 0.5);
    global_scale ~ gamma(0.5, 0.5);
    train_labels ~ bernoulli_logit(logits);
  }
}
""",
    # tools/stan/radon_contextual_effects.py as published, in today's Stan syntax, with its
    # transformed parameter (the 919 fitted means) a local of the model block: the same density,
    # without 919 output columns
    "radon_contextual_effects": """// Inference Gym's radon contextual effects (TensorFlow Probability,
// spinoffs/inference_gym/inference_gym/tools/stan/radon_contextual_effects.py; Apache-2.0,
// inference_gym/LICENCE.md), its fitted means a local of the model block
data {
  int<lower=0> num_counties;
  int<lower=0> num_train;
  array[num_train] int<lower=0, upper=num_counties - 1> county;
  vector[num_train] log_uranium;
  vector[num_train] which_floor;
  vector[num_train] floor_by_county;
  vector[num_train] log_radon;
}
parameters {
  vector[num_counties] county_effect;
  vector[3] weight;
  real county_effect_mean;
  real<lower=0, upper=100> county_effect_scale;
  real<lower=0, upper=100> log_radon_scale;
}
model {
  vector[num_train] log_radon_mean;
  for (i in 1:num_train)
    log_radon_mean[i] = county_effect[county[i] + 1]
                        + log_uranium[i] * weight[1]
                        + which_floor[i] * weight[2]
                        + floor_by_county[i] * weight[3];
  county_effect_mean ~ normal(0, 1);
  county_effect ~ normal(county_effect_mean, county_effect_scale);
  weight ~ normal(0, 1);
  log_radon ~ normal(log_radon_mean, log_radon_scale);
}
""",
}


def radon_minnesota(posteriordb: str) -> dict:
    """internal/data.py's `radon(state='MN', num_examples=919, num_counties=85)` rebuilt from the
    survey files tensorflow_datasets' radon is made of: Minnesota's rows of srrs2.dat with the
    county's soil uranium (cty.dat's Uppm, by state and county FIPS code), floors above 1 dropped
    (Minnesota has none), radon activity at or below 0 set to 0.1 and logged, the uranium logged,
    counties numbered 0..84 in sorted order of their names, and each county's mean floor."""
    import csv
    import io
    import zipfile
    raw = os.path.join(posteriordb, "posterior_database", "data", "data-raw", "radon")

    def table(name):
        with zipfile.ZipFile(os.path.join(raw, name + ".zip")) as z:
            text = z.read(name).decode()
        return [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(io.StringIO(text))]
    uranium = {(int(c["stfips"]), int(c["ctfips"])): float(c["Uppm"]) for c in table("cty.dat")}
    rows = [r for r in table("srrs2.dat") if r["state"] == "MN" and int(r["floor"]) <= 1]
    floor = np.array([int(r["floor"]) for r in rows])
    activity = np.array([float(r["activity"]) for r in rows])
    activity[activity <= 0] = 0.1
    log_uranium = np.log([uranium[(int(r["stfips"]), int(r["cntyfips"]))] for r in rows])
    names, county = np.unique([r["county"] for r in rows], return_inverse=True)
    if len(rows) != 919 or names.size != 85:
        sys.exit(f"radon: {len(rows)} rows and {names.size} counties, Inference Gym has 919 and 85")
    by_county = np.array([floor[county == i].mean() for i in range(names.size)])
    return {"num_counties": int(names.size), "num_train": len(rows), "county": [int(c) for c in county],
            "log_uranium": log_uranium.tolist(), "which_floor": [float(f) for f in floor],
            "floor_by_county": by_county[county].tolist(), "log_radon": np.log(activity).tolist()}


def german_credit() -> dict:
    """internal/data.py's german_credit_numeric (all 1,000 points for training; the UCI file nmcmc
    ships in data/uci/): the 24 features normalised to mean 0 and sd 1 (numpy's sd, ddof 0), a
    column of ones appended (tools/stan's _add_bias); label 1 for bad credit (the file's 2)."""
    rows = np.loadtxt(UCI_GERMAN)
    x = rows[:, :24]
    x = (x - x.mean(0, keepdims=True)) / x.std(0, keepdims=True)
    x = np.concatenate([x, np.ones([x.shape[0], 1])], axis=-1)
    y = (rows[:, 24] - 1).astype(int)
    return {"num_train_points": int(x.shape[0]), "num_features": int(x.shape[1]),
            "train_features": x.tolist(), "train_labels": [int(v) for v in y]}


def module_values(path: str) -> dict:
    """The upper-case numpy constants a ground-truth or dataset module defines."""
    scope = {"np": np}
    with open(path) as f:
        source = f.read()
    exec(compile(re.sub(r"^(import|from) .*$", "", source, flags=re.M), path, "exec"), scope)
    return {k: v for k, v in scope.items() if k.isupper()}


def vendor(tfp: str, posteriordb: str, name: str) -> None:
    truth_mod, data_mod, program, quantities = POSTERIORS[name]
    gym = os.path.join(tfp, "spinoffs", "inference_gym", "inference_gym")
    truth = module_values(os.path.join(gym, "targets", "ground_truth", truth_mod + ".py"))
    if data_mod is None:
        stan_data = german_credit()
    elif data_mod == "radon":
        stan_data = radon_minnesota(posteriordb)
    else:
        data = module_values(os.path.join(gym, "internal", "datasets", data_mod + ".py"))
        observed = np.asarray(data["OBSERVED_LOC"], dtype=float)
        seen = ~np.isnan(observed)
        stan_data = {"num_timesteps": int(observed.size), "num_observations": int(seen.sum()),
                     "observation_indices": [int(i) for i in np.arange(1, observed.size + 1)[seen]],
                     "observations": [float(v) for v in observed[seen]]}
    names, mean, sd, ess = [], [], [], []
    for key, stan_name, scalar in quantities:
        m = np.atleast_1d(truth[f"IDENTITY_{key}_MEAN"])
        s = np.atleast_1d(truth[f"IDENTITY_{key}_STANDARD_DEVIATION"])
        se = np.atleast_1d(truth[f"IDENTITY_{key}_MEAN_STANDARD_ERROR"])
        for k in range(m.size):
            names.append(stan_name if scalar else f"{stan_name}.{k + 1}")
            mean.append(float(m[k]))
            sd.append(float(s[k]))
            ess.append(float((s[k] / se[k]) ** 2))
    ref = {"posterior": name, "model": program, "data": name,
           "source": "tensorflow/probability spinoffs/inference_gym: targets/ground_truth/" + truth_mod + ".py, " +
                     ("internal/data.py's radon (Minnesota) from stan-dev/posteriordb's data-raw/radon"
                      if data_mod == "radon" else
                      "internal/datasets/" + data_mod + ".py" if data_mod else
                      "internal/data.py's german_credit_numeric from data/uci/german.data-numeric") +
                     ", tools/stan (Apache-2.0)",
           "inference": {"method": "Inference Gym ground truth (Stan; get_ground_truth --stan_samples=20000)"},
           "names": names, "mean": mean, "sd": sd, "n": int(round(max(ess))), "ess_bulk": ess}
    for sub in ("stan", "data", "stan_reference"):
        os.makedirs(os.path.join(OUT, sub), exist_ok=True)
    with open(os.path.join(OUT, "stan", program + ".stan"), "w") as f:
        f.write(STAN[program])
    with open(os.path.join(OUT, "data", name + ".json"), "w") as f:
        json.dump(stan_data, f, indent=1)
    with open(os.path.join(OUT, "stan_reference", name + ".json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{name}: {len(names)} quantities, reference ESS {min(ess):.0f}-{max(ess):.0f}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: scripts/inference_gym_vendor.py TFP_CHECKOUT POSTERIORDB_CHECKOUT")
    for p in POSTERIORS:
        vendor(sys.argv[1], sys.argv[2], p)
