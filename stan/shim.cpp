// nmcmc's C interface (include/nmcmc/targets/stan_abi.h) around one Stan program.
//
// Not part of the nmcmc library: the program's builder (apps/process/stan_build.cpp) compiles this
// file together with the C++ that Stan's compiler wrote for the program (included first, so that
// `stan_model` names its class), against Stan's own headers, into a shared library that
// targets/stan.cpp loads. Written for Stan 2.21 (Debian's r-cran-stanheaders) in C++14.
#include <stan/model/log_prob_grad.hpp>
#include <stan/model/log_prob_propto.hpp>
#include <stan/io/array_var_context.hpp>
#include <stan/version.hpp>
#include <stan/services/util/create_rng.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nmcmc/targets/stan_abi.h"

namespace {

using json = nlohmann::json;

char* copy_message(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

/// rstan's compiler names the class model<hash>_NAME; messages say NAME.
std::string program_name(std::string s) {
  for (size_t at = s.find("model"); at != std::string::npos; at = s.find("model", at + 1)) {
    const size_t underscore = s.find('_', at + 5);
    if (underscore != std::string::npos && underscore >= at + 5 + 8 &&
        s.find_first_not_of("0123456789abcdef", at + 5) == underscore) {
      s.erase(at, underscore + 1 - at);
    }
  }
  return s;
}

void set_error(char** error, const std::string& message) {
  if (error) *error = copy_message(program_name(message));
}

/// One data variable read from CmdStan's JSON: its dimensions and its values in the column-major
/// order that Stan's var_context uses (the first index runs fastest).
struct Variable {
  std::vector<size_t> dims;
  std::vector<double> reals;
  std::vector<int> ints;
  bool integer = true;  // every value is a JSON integer (an int variable reads it; so does a real)
};

/// A scalar: a number, or CmdStan's strings for the non-finite values.
double scalar_value(const std::string& name, const json& v, bool& integer) {
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<double>();
  integer = false;
  if (v.is_number_float()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Inf" || s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Inf" || s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  throw std::runtime_error("data variable '" + name + "': a value is neither a number nor \"NaN\"/\"Inf\"/\"-Inf\": " +
                           v.dump().substr(0, 80));
}

/// The dimensions of a rectangular nested array (throws for a ragged one).
void read_dims(const std::string& name, const json& v, size_t depth, std::vector<size_t>& dims) {
  if (!v.is_array()) {
    if (depth != dims.size() && !dims.empty()) throw std::runtime_error("data variable '" + name + "' is ragged");
    return;
  }
  if (depth == dims.size()) dims.push_back(v.size());
  else if (dims[depth] != v.size()) throw std::runtime_error("data variable '" + name + "' is ragged (not rectangular)");
  for (const json& e : v) read_dims(name, e, depth + 1, dims);
}

Variable read_variable(const std::string& name, const json& v) {
  Variable out;
  read_dims(name, v, 0, out.dims);
  size_t n = 1;
  for (size_t d : out.dims) n *= d;
  out.reals.assign(n, 0.0);
  // Walk in row-major order (the JSON's nesting) and place each value at its column-major offset.
  std::vector<size_t> index(out.dims.size(), 0);
  const auto place = [&](const json& leaf) {
    size_t offset = 0, stride = 1;
    for (size_t k = 0; k < index.size(); ++k) {
      offset += index[k] * stride;
      stride *= out.dims[k];
    }
    out.reals[offset] = scalar_value(name, leaf, out.integer);
  };
  std::function<void(const json&, size_t)> walk = [&](const json& e, size_t depth) {
    if (depth == out.dims.size()) {
      if (e.is_array()) throw std::runtime_error("data variable '" + name + "' is ragged (not rectangular)");
      place(e);
      return;
    }
    if (!e.is_array()) throw std::runtime_error("data variable '" + name + "' is ragged (not rectangular)");
    for (size_t i = 0; i < e.size(); ++i) {
      index[depth] = i;
      walk(e[i], depth + 1);
    }
  };
  walk(v, 0);
  if (out.integer) {
    for (double r : out.reals) {
      if (r < std::numeric_limits<int>::min() || r > std::numeric_limits<int>::max()) {
        out.integer = false;
        break;
      }
    }
  }
  if (out.integer) out.ints.assign(out.reals.begin(), out.reals.end());
  return out;
}

/// Stan's var_context over CmdStan's JSON data format.
class JsonContext : public stan::io::var_context {
 public:
  explicit JsonContext(const std::string& text) {
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) return;
    json j;
    try {
      j = json::parse(text);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("the data are not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw std::runtime_error("the data must be a JSON object of variables");
    for (auto it = j.begin(); it != j.end(); ++it) vars_[it.key()] = read_variable(it.key(), it.value());
  }
  bool contains_r(const std::string& name) const override { return vars_.count(name) > 0; }
  bool contains_i(const std::string& name) const override {
    auto it = vars_.find(name);
    return it != vars_.end() && it->second.integer;
  }
  std::vector<double> vals_r(const std::string& name) const override { return find(name).reals; }
  std::vector<int> vals_i(const std::string& name) const override { return find(name).ints; }
  std::vector<size_t> dims_r(const std::string& name) const override { return find(name).dims; }
  std::vector<size_t> dims_i(const std::string& name) const override { return find(name).dims; }
  void names_r(std::vector<std::string>& names) const override {
    names.clear();
    for (const auto& kv : vars_) names.push_back(kv.first);
  }
  void names_i(std::vector<std::string>& names) const override {
    names.clear();
    for (const auto& kv : vars_)
      if (kv.second.integer) names.push_back(kv.first);
  }

 private:
  const Variable& find(const std::string& name) const {
    auto it = vars_.find(name);
    if (it == vars_.end()) throw std::runtime_error("variable does not exist; variable name=" + name);
    return it->second;
  }
  std::map<std::string, Variable> vars_;
};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
  return out;
}

/// Each thread that evaluates a gradient needs its own autodiff tape (Stan's is thread-local).
void ensure_tape() { static thread_local stan::math::ChainableStack tape; }

}  // namespace

struct nmcmc_stan_model {
  std::unique_ptr<stan_model> model;
  std::string name;
  std::string names[2][2];  // constrained [tp][gq]
  std::string unconstrained_names;
  int n_unc = 0, n_params = 0, n_tp = 0, n_all = 0;
  std::vector<std::string> param_vars;          // the parameters' variable names
  std::vector<std::vector<size_t>> param_dims;  // and dimensions
};

extern "C" {

int nmcmc_stan_abi_version(void) { return NMCMC_STAN_ABI_VERSION; }
const char* nmcmc_stan_version(void) { return STAN_STRING(STAN_MAJOR) "." STAN_STRING(STAN_MINOR) "." STAN_STRING(STAN_PATCH); }

nmcmc_stan_model* nmcmc_stan_new(const char* data_json, unsigned int seed, char** error) {
  try {
    ensure_tape();
    JsonContext context(data_json ? data_json : "");
    std::unique_ptr<nmcmc_stan_model> m(new nmcmc_stan_model());
    std::stringstream msgs;
    m->model.reset(new stan_model(context, seed, &msgs));
    const stan_model& model = *m->model;
    m->name = program_name(model.model_name());
    std::vector<std::string> names;
    for (int tp = 0; tp < 2; ++tp) {
      for (int gq = 0; gq < 2; ++gq) {
        names.clear();
        model.constrained_param_names(names, tp, gq);
        m->names[tp][gq] = join(names);
        if (!tp && !gq) m->n_params = static_cast<int>(names.size());
        if (tp && !gq) m->n_tp = static_cast<int>(names.size());
        if (tp && gq) m->n_all = static_cast<int>(names.size());
      }
    }
    names.clear();
    model.unconstrained_param_names(names, false, false);
    m->unconstrained_names = join(names);
    m->n_unc = static_cast<int>(model.num_params_r());
    // The parameters' variables come first in get_param_names; they hold n_params values.
    std::vector<std::string> vars;
    std::vector<std::vector<size_t>> dims;
    model.get_param_names(vars);
    model.get_dims(dims);
    size_t total = 0;
    for (size_t i = 0; i < vars.size() && total < static_cast<size_t>(m->n_params); ++i) {
      size_t n = 1;
      for (size_t d : dims[i]) n *= d;
      m->param_vars.push_back(vars[i]);
      m->param_dims.push_back(dims[i]);
      total += n;
    }
    return m.release();
  } catch (const std::exception& e) {
    set_error(error, e.what());
  } catch (...) {
    set_error(error, "unknown error while reading the data");
  }
  return nullptr;
}

void nmcmc_stan_free(nmcmc_stan_model* model) { delete model; }
void nmcmc_stan_free_error(char* error) { std::free(error); }

const char* nmcmc_stan_name(const nmcmc_stan_model* model) { return model->name.c_str(); }

int nmcmc_stan_dims(const nmcmc_stan_model* model, int* unconstrained, int* params, int* params_tp, int* params_tp_gq) {
  if (unconstrained) *unconstrained = model->n_unc;
  if (params) *params = model->n_params;
  if (params_tp) *params_tp = model->n_tp;
  if (params_tp_gq) *params_tp_gq = model->n_all;
  return 0;
}

const char* nmcmc_stan_names(const nmcmc_stan_model* model, int unconstrained, int include_tp, int include_gq) {
  if (unconstrained) return model->unconstrained_names.c_str();
  return model->names[include_tp ? 1 : 0][include_gq ? 1 : 0].c_str();
}

int nmcmc_stan_log_density(const nmcmc_stan_model* model, int propto, int jacobian, const double* x, double* lp,
                           double* grad, char** error) {
  try {
    ensure_tape();
    std::vector<double> params(x, x + model->n_unc);
    std::vector<int> params_i;
    std::stringstream msgs;
    const stan_model& m = *model->model;
    if (grad) {
      std::vector<double> g;
      if (propto) {
        *lp = jacobian ? stan::model::log_prob_grad<true, true>(m, params, params_i, g, &msgs)
                       : stan::model::log_prob_grad<true, false>(m, params, params_i, g, &msgs);
      } else {
        *lp = jacobian ? stan::model::log_prob_grad<false, true>(m, params, params_i, g, &msgs)
                       : stan::model::log_prob_grad<false, false>(m, params, params_i, g, &msgs);
      }
      std::copy(g.begin(), g.end(), grad);
    } else if (propto) {
      // Constants are dropped only where the terms are autodiff variables: the same value as with grad.
      *lp = jacobian ? stan::model::log_prob_propto<true>(m, params, params_i, &msgs)
                     : stan::model::log_prob_propto<false>(m, params, params_i, &msgs);
    } else {
      *lp = jacobian ? m.template log_prob<false, true>(params, params_i, &msgs)
                     : m.template log_prob<false, false>(params, params_i, &msgs);
    }
    return 0;
  } catch (const std::exception& e) {
    set_error(error, e.what());
  } catch (...) {
    set_error(error, "unknown error in the log density");
  }
  return 1;
}

int nmcmc_stan_constrain(const nmcmc_stan_model* model, int include_tp, int include_gq, const double* x,
                         unsigned long long rng_seed, double* out, char** error) {
  try {
    std::vector<double> params(x, x + model->n_unc), values;
    std::vector<int> params_i;
    std::stringstream msgs;
    boost::ecuyer1988 rng = stan::services::util::create_rng(static_cast<unsigned int>(rng_seed),
                                                             static_cast<unsigned int>(rng_seed >> 32));
    model->model->write_array(rng, params, params_i, values, include_tp != 0, include_gq != 0, &msgs);
    std::copy(values.begin(), values.end(), out);
    return 0;
  } catch (const std::exception& e) {
    set_error(error, e.what());
  } catch (...) {
    set_error(error, "unknown error in the generated quantities");
  }
  return 1;
}

int nmcmc_stan_unconstrain(const nmcmc_stan_model* model, const double* constrained, double* x, char** error) {
  try {
    std::vector<double> values(constrained, constrained + model->n_params), params;
    std::vector<int> params_i;
    stan::io::array_var_context context(model->param_vars, values, model->param_dims);
    std::stringstream msgs;
    model->model->transform_inits(context, params_i, params, &msgs);
    std::copy(params.begin(), params.end(), x);
    return 0;
  } catch (const std::exception& e) {
    set_error(error, e.what());
  } catch (...) {
    set_error(error, "unknown error in unconstrain");
  }
  return 1;
}

}  // extern "C"
