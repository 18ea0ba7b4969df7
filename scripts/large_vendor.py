#!/usr/bin/python3
"""Vendors posteriordb's larger posteriors that have no reference draws into large/: the Stan
program and its data in posteriordb/'s layout (stan/, data/), for references made by
scripts/large_reference.R (large/stan_reference/) and the large suite
(`scripts/posteriordb.py check --suite large`).

    scripts/large_vendor.py POSTERIORDB_CHECKOUT

POSTERIORDB_CHECKOUT: a checkout (or `git archive`) of stan-dev/posteriordb. Nothing is downloaded.
"""
import json
import os
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "large")

# posteriordb's names; posteriors.json records each one's quantities as posteriordb's info counts
# them (parameters, transformed parameters and generated quantities: not the dimension)
POSTERIORS = [
    "irt_2pl-irt_2pl",
    "radon_mn-radon_variable_intercept_slope_noncentered",
    "GLMM_Poisson_data-GLMM_Poisson_model",
    "state_wide_presidential_votes-hierarchical_gp",
    "uk_drivers-state_space_stochastic_level_stochastic_seasonal",
    "sat-hier_2pl",
    "radon_all-radon_hierarchical_intercept_noncentered",
    "election88-election88_full",
    "ovarian-logistic_regression_rhs",
]


def local_linear_predictor(program: str) -> str:
    """election88_full declares its 11,566 linear predictors y_hat a transformed parameter, so every
    draw would carry 11,566 more columns (a 4 x 1,000 run's Stan CSV about half a gigabyte, and
    rstan's 10 x 10,000 reference draws 9 GB in memory): the block moves into the model block as
    local variables, the same density and the same parameters."""
    start, model = program.index("transformed parameters {"), program.index("model {")
    block = program[start:model]
    body = block[len("transformed parameters {"):block.rindex("}")]
    return program[:start] + "model {" + body.rstrip() + "\n" + program[model + len("model {"):]


# programs vendored with a rewrite, each stated in the program's first comment
REWRITES = {"election88_full": (local_linear_predictor,
                                "y_hat moved from transformed parameters into the model block as a local variable")}


def vendor(pdb: str, name: str) -> None:
    db = os.path.join(pdb, "posterior_database")
    with open(os.path.join(db, "posteriors", name + ".json")) as f:
        info = json.load(f)
    model, data = info["model_name"], info["data_name"]
    with open(os.path.join(db, "models", "stan", model + ".stan")) as f:
        program = f.read()
    with zipfile.ZipFile(os.path.join(db, "data", "data", data + ".json.zip")) as z:
        values = json.loads(z.read(data + ".json"))
    for sub in ("stan", "data"):
        os.makedirs(os.path.join(OUT, sub), exist_ok=True)
    note = ""
    if model in REWRITES:
        rewrite, said = REWRITES[model]
        program, note = rewrite(program), f"; {said} (scripts/large_vendor.py)"
    with open(os.path.join(OUT, "stan", model + ".stan"), "w") as f:
        f.write(f"// stan-dev/posteriordb posterior_database/models/stan/{model}.stan (licence: large/LICENCE.md){note}\n")
        f.write(program)
    with open(os.path.join(OUT, "data", data + ".json"), "w") as f:
        json.dump(values, f)
    dim = sum(int(v) if not isinstance(v, list) else int(eval("*".join(map(str, v)) or "1"))
              for v in info["dimensions"].values())
    with open(os.path.join(OUT, "posteriors.json"), "a") as f:
        f.write(json.dumps({"posterior": name, "model": model, "data": data, "quantities": dim,
                            "keywords": info.get("keywords")}) + "\n")
    print(f"{name}: {model} on {data}, {dim} quantities")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/large_vendor.py POSTERIORDB_CHECKOUT")
    if os.path.exists(os.path.join(OUT, "posteriors.json")):
        os.remove(os.path.join(OUT, "posteriors.json"))
    for p in POSTERIORS:
        vendor(sys.argv[1], p)
