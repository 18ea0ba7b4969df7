#pragma once
/// Deep energy-based image models (paper section 4.2): everything in one include.
#include "nmcmc/images/ebm_options.hpp"
#include "nmcmc/images/ebm_trainer.hpp"
#include "nmcmc/images/energy_net.hpp"
