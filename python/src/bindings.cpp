// The Python package's C++ half (`nmcmc._nmcmc`): thin bindings over the services, built with
// pybind11 against the same LibTorch as python3-torch, so tensors cross without copies.
// Structured values cross as JSON text; python/nmcmc/__init__.py is the API users see.
#include <torch/extension.h>

#include <chrono>
#include <iostream>
#include <filesystem>
#include <optional>
#include <sstream>

#include "nmcmc/core/tensor_options.hpp"
#include "nmcmc/nmcmc.hpp"
#include "nmcmc/services/compare.hpp"
#include "nmcmc/process/allocator.hpp"
#include "nmcmc/process/blas_kernels.hpp"
#include "nmcmc/process/environment.hpp"
#include "nmcmc/process/figures.hpp"
#include "nmcmc/process/stan_build.hpp"
#include "nmcmc/targets/stan.hpp"
#include "nmcmc/targets/torchscript.hpp"
#include "nmcmc/version.hpp"

namespace py = pybind11;
using json = nlohmann::json;

namespace {

torch::TensorOptions tensor_options(const std::string& dtype, const std::string& device) {
  return nmcmc::parse_tensor_options(dtype, device);
}

/// Calls `report` (a Python callable or None) with a dict, holding the GIL, and turns a pending
/// Ctrl-C into KeyboardInterrupt (thrown through the C++ run as error_already_set).
struct PythonHook {
  py::object report;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  void check_signals() {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  void call(py::dict d) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (!report.is_none()) report(d);
  }
};

py::dict sample(const std::string& request_json, std::optional<torch::Tensor> init_x, py::object report) {
  json j = json::parse(request_json);
  nmcmc::SampleRequest r;
  r.target = j.value("target", json());
  r.options = nmcmc::sample_options_from_json(j.at("options"));
  r.command = "python: nmcmc.sample";
  if (init_x) r.init_x = *init_x;
  PythonHook hook{report};
  nmcmc::SampleOutcome out;
  {
    py::gil_scoped_release release;
    out = nmcmc::sample(r, [&](const nmcmc::Progress& p) {
      py::gil_scoped_acquire gil;
      py::dict d;
      d["phase"] = p.phase;
      d["iteration"] = p.iteration;
      d["total"] = p.total;
      d["accept"] = p.accept;
      d["step_size"] = p.step_size;
      d["elapsed"] = p.elapsed;
      hook.call(d);
    });
  }
  const nmcmc::SampleResult& s = out.result;
  py::dict d;
  d["draws"] = s.draws;
  d["lp"] = s.lp;
  d["accept_stat"] = s.accept_stat;
  d["divergent"] = s.divergent;
  d["n_grad"] = s.n_grad_chain.defined() ? s.n_grad_chain : s.n_grad.unsqueeze(1).expand({-1, s.lp.size(1)}).contiguous();
  if (s.tree_depth.defined()) d["tree_depth"] = s.tree_depth;
  if (s.energy.defined()) d["energy"] = s.energy;
  if (s.inv_mass.defined()) d["inv_mass"] = s.inv_mass;
  d["step_size"] = s.step_size;
  d["names"] = s.names;
  d["summary"] = out.summary.dump();
  d["config"] = out.config.dump();
  d["summary_text"] = nmcmc::format_summary(out.summary);
  return d;
}

py::dict train(const std::string& config_json, const std::string& output, const std::string& log_path, bool resume,
               const std::string& device, py::object report) {
  nmcmc::TrainConfig cfg = nmcmc::parse_train_config(json::parse(config_json));
  PythonHook hook{report};
  bool interrupted_by_signal = false;
  nmcmc::TrainResult res;
  {
    py::gil_scoped_release release;
    res = nmcmc::train(
        cfg, torch::Device(device), output, log_path, resume,
        [&](const nmcmc::TrainProgress& p) {
          py::gil_scoped_acquire gil;
          if (report.is_none()) return;
          py::dict d;
          d["phase"] = p.phase;
          d["step"] = p.stats.step;
          d["total"] = p.total;
          if (p.phase == "fit") d["loss"] = p.stats.loss;
          d["accept"] = p.stats.accept;
          d["beta"] = p.stats.beta;
          d["eps"] = p.stats.eps;
          d["elapsed"] = p.elapsed;
          report(d);
        },
        [&]() {
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) {
            PyErr_Clear();
            interrupted_by_signal = true;
            return true;
          }
          return false;
        });
  }
  py::dict d;
  d["steps"] = res.steps;
  d["seconds"] = res.seconds;
  d["grads"] = res.grads;
  d["interrupted"] = res.interrupted || interrupted_by_signal;
  d["saved"] = res.saved;
  d["skipped"] = res.skipped;
  d["stopped"] = res.stopped;
  d["bad_rows"] = res.bad_rows;
  if (!res.preconditioner.is_null()) d["preconditioner"] = py::module_::import("json").attr("loads")(res.preconditioner.dump());
  if (!res.check.is_null()) d["check"] = py::module_::import("json").attr("loads")(res.check.dump());
  d["time_extensions"] = py::module_::import("json").attr("loads")(res.time_extensions.dump());
  if (!res.from.is_null()) d["from"] = py::module_::import("json").attr("loads")(res.from.dump());
  d["probes"] = py::module_::import("json").attr("loads")(res.probes.dump());
  return d;
}

std::string compare(const std::string& options_json, py::object report) {
  json j = json::parse(options_json);
  const nmcmc::CompareOptions o = nmcmc::compare_options_from_json(j);
  PythonHook hook{report};
  json result;
  {
    py::gil_scoped_release release;
    const auto start = std::filesystem::file_time_type::clock::now() - std::chrono::seconds(1);
    result = nmcmc::compare(
        o,
        [&](const std::string& line) {
          py::gil_scoped_acquire gil;
          if (!report.is_none()) report(py::dict(py::arg("message") = line));
        },
        nullptr, [&](const nmcmc::Progress&) { hook.check_signals(); }, nullptr);
    // Its figure (compare_traces) with matplotlib; the outcome goes into the result.
    const nmcmc::RenderOutcome figures = nmcmc::render_figures(nmcmc::figure_specs_written_since(o.output, start));
    result["figures"] = {{"drawn", figures.drawn}, {"message", figures.message}};
  }
  return result.dump();
}

}  // namespace

/// A Stan program's target, or a UsageError naming what asked for one.
nmcmc::StanTarget& stan_of(nmcmc::Target& t, const char* what) {
  auto* s = dynamic_cast<nmcmc::StanTarget*>(&t);
  if (!s) throw nmcmc::UsageError(std::string(what) + ": only a Stan program's target (nmcmc.stan_model) has a constrained scale");
  return *s;
}

std::string report(const std::string& run_dir, std::optional<std::string> output) {
  py::gil_scoped_release release;
  return nmcmc::write_report(run_dir, output);
}

PYBIND11_MODULE(_nmcmc, m) {
  m.doc() = "nmcmc's C++ core (use the nmcmc package, not this module)";
  nmcmc::apply_environment();  // NMCMC_DATA_DIR, NMCMC_FASHION_MNIST: the library reads no variable
  // Importing nmcmc leaves the process's malloc alone (nmcmc.tune_allocator() opts in).
  py::register_exception<nmcmc::UsageError>(m, "UsageError", PyExc_ValueError);
  py::register_exception<nmcmc::DataError>(m, "DataError", PyExc_ValueError);
  py::register_exception<nmcmc::IoError>(m, "IoError", PyExc_OSError);
  // A malformed value in what Python passed (its JSON) is the caller's error too.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const json::exception& e) {
      PyErr_SetString(PyExc_ValueError, (std::string("nmcmc: ") + e.what()).c_str());
    }
  });

  // Note [Stan programs]: nmcmc.stan_model compiles on first use (told on stderr) and caches.
  nmcmc::register_stan_builder([](const std::string& message) { std::cerr << "nmcmc: " << message << std::endl; });

  m.def("tune_allocator", [] {
    const nmcmc::AllocatorPolicy p = nmcmc::tune_allocator();
    return py::make_tuple(p.applied, p.message);
  });
  m.def("report", &report, py::arg("run_dir"), py::arg("output") = py::none());
  m.def("version", [] { return std::string(NMCMC_VERSION); });
  m.def("blas_kernels", [] {  // Note [OpenBLAS's kernels]
    const nmcmc::BlasKernels k = nmcmc::blas_kernels();
    return py::make_tuple(k.loaded, k.better, k.describe());
  });
  m.def("torch_version", [] { return std::string(TORCH_VERSION); });
  m.def("targets", [] {
    json out = json::array();
    for (const auto& info : nmcmc::target_catalogue()) {
      json opts = json::object();
      for (const auto& [k, v] : info.options) opts[k] = v;
      out.push_back({{"name", info.name}, {"description", info.description}, {"options", opts}});
    }
    return out.dump();
  });
  m.def(
      "register_module",
      [](py::bytes b) {
        std::string bytes(b);
        py::gil_scoped_release release;
        return nmcmc::register_torchscript_module(bytes);
      },
      "keep a TorchScript module (torch.jit.save bytes) in this process; returns its key");
  m.def("sample_defaults", [] { return json(nmcmc::SampleOptions()).dump(); },
        "sample's options as the C++ definition sets them (JSON)");
  m.def("compare_defaults", [] { return json(nmcmc::CompareOptions()).dump(); },
        "compare's options as the C++ definition sets them (JSON)");
  m.def(
      "stan_summary",
      [](const torch::Tensor& draws) {
        if (draws.dim() != 3 || draws.size(0) < 1 || draws.size(2) < 1)
          throw nmcmc::UsageError("summarise: draws must be [draws, chains, parameters] with at least one draw, got " +
                                  c10::str(draws.sizes()));
        const nmcmc::StanSummary s = nmcmc::stan_summary(draws.to(torch::kFloat64).contiguous());
        py::dict out;
        out["mean"] = s.mean;
        out["sd"] = s.sd;
        out["mcse_mean"] = s.mcse_mean;
        out["mcse_sd"] = s.mcse_sd;
        out["q05"] = s.q05;
        out["q50"] = s.q50;
        out["q95"] = s.q95;
        out["ess_bulk"] = s.ess_bulk;
        out["ess_tail"] = s.ess_tail;
        out["rhat"] = s.rhat;
        return out;
      },
      "the Stan / posterior-package summary of draws [S, C, D]: fields [D]");
  m.def("release_module", &nmcmc::release_torchscript_module, "drop a kept module's bytes (its key)");
  m.def("registered_modules", &nmcmc::registered_torchscript_modules, "how many modules are kept");

  py::class_<nmcmc::Target, std::shared_ptr<nmcmc::Target>>(m, "Target")
      .def_property_readonly("name", &nmcmc::Target::name)
      .def_property_readonly("dim", &nmcmc::Target::dim)
      .def_property_readonly("spec", [](const nmcmc::Target& t) { return t.spec().dump(); })
      .def_property_readonly("names", [](const nmcmc::Target& t) { return nmcmc::parameter_labels(t); })
      .def_property_readonly("has_sampler", &nmcmc::Target::has_sampler)
      .def_property_readonly("engine",
                             [](const nmcmc::Target& t) {
                               auto* ts = dynamic_cast<const nmcmc::TorchScriptTarget*>(&t);
                               return ts ? py::make_tuple(ts->engine(), ts->engine_note())
                                         : py::make_tuple("builtin", "");
                             })
      .def_property_readonly("reference_moments",
                             [](const nmcmc::Target& t) -> py::object {
                               auto m = t.reference_moments();
                               if (!m) return py::none();
                               return py::make_tuple(m->mean, m->sd);
                             })
      .def(
          "constrain",
          [](nmcmc::Target& t, const torch::Tensor& x, bool transformed, bool generated, uint64_t seed) {
            return stan_of(t, "constrain").constrain(x, transformed, generated, seed);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "unconstrain", [](nmcmc::Target& t, const torch::Tensor& c) { return stan_of(t, "unconstrain").unconstrain(c); },
          py::call_guard<py::gil_scoped_release>())
      .def("constrained_names",
           [](nmcmc::Target& t, bool transformed, bool generated) {
             return stan_of(t, "constrained_names").constrained_names(transformed, generated);
           })
      .def(
          "energy",
          [](nmcmc::Target& t, const torch::Tensor& x) {
            torch::NoGradGuard g;
            return t.energy(x);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "energy_and_grad",
          [](nmcmc::Target& t, const torch::Tensor& x) {
            auto eg = t.energy_and_grad(x);
            return std::make_tuple(eg.energy, eg.grad);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "sample",
          [](nmcmc::Target& t, int64_t n, uint64_t seed) {
            at::Generator gen = nmcmc::make_generator(seed, t.options().device());
            return t.sample(n, gen);
          },
          py::call_guard<py::gil_scoped_release>());
  m.def("make_target",
        [](const std::string& spec, const std::string& dtype, const std::string& device) {
          return std::shared_ptr<nmcmc::Target>(nmcmc::make_target(json::parse(spec), tensor_options(dtype, device)));
        },
        py::call_guard<py::gil_scoped_release>());
  m.def("sample", &sample, py::arg("request"), py::arg("init_x"), py::arg("report"));
  m.def("train", &train);
  m.def("default_train_config", [] { return nmcmc::default_train_config().dump(); });
  m.def("parse_train_config", [](const std::string& j) { return nmcmc::parse_train_config(json::parse(j)).to_json().dump(); });
  m.def(
      "model_meta",
      [](const std::string& path) {
        auto run = nmcmc::load_learned_run(path, std::nullopt, torch::TensorOptions(), false);
        return run.meta.dump();
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("compare", &compare);
  m.def("compare_table", [](const std::string& j) { return nmcmc::compare_table(json::parse(j)); });
  m.def("format_summary", [](const std::string& j, int64_t rows) { return nmcmc::format_summary(json::parse(j), rows); });
}
