// `nmcmc launch --nproc N -- COMMAND ...`: N local ranks of one command (Note [Data parallelism]).
#include <fmt/format.h>

#include <iostream>

#include "cli.hpp"
#include "nmcmc/process/launch.hpp"

namespace nmcmc::cli {

Command add_launch_command(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch", "run a command as N processes on this machine (data-parallel train, "
                                           "ebm train; sharded sample): nmcmc launch --nproc 2 -- train ...");
  cmd->add_option("--nproc,-n", o->nproc, "number of processes (ranks)")->capture_default_str();
  cmd->add_option("--port", o->port, "port of rank 0's rendezvous store (0: a free one)")->capture_default_str();
  cmd->add_option("--dist-timeout", o->timeout, "seconds a rank waits for another before giving up")
      ->capture_default_str();
  cmd->add_option("--grace", o->grace, "seconds the others get to stop by themselves after a rank fails "
                                       "(default: the timeout + 30), then they are terminated");
  cmd->add_option("command", o->args, "the nmcmc command and its options, after --")->expected(-1);
  cmd->footer("Everything after -- is the nmcmc command each rank runs, with MASTER_ADDR, MASTER_PORT, WORLD_SIZE, "
              "RANK and LOCAL_RANK set. Ctrl-C is forwarded once to every rank (training saves a checkpoint and "
              "stops); the exit code is the worst of the ranks'.");
  return {cmd, [o, cmd] {
            const LaunchOptions& options = *o;
            LaunchResult r = launch_local(options);
            for (const auto& note : r.notes) std::cerr << "nmcmc launch: " << note << "\n";
            return r.code;
          }};
}

}  // namespace nmcmc::cli
