/*
 * dtrain.h — the public interface of libdtrain, the one header a program
 * includes. It includes every public sub-header under include/dtrain/:
 *
 *   dtrain/core.h    errors (DT_E*, dt_strerror, dt_errmsg), version, DT_API
 *   dtrain/model.h   models from a spec string or layer by layer; forward, backward
 *   dtrain/data.h    datasets from IDX/CSV/npy files or caller memory
 *   dtrain/optim.h   optimizers and learning-rate schedules
 *   dtrain/comm.h    rendezvous store, communicators and collectives
 *   dtrain/engine.h  training runs: configs, engines, callbacks, summaries
 *   dtrain/job.h     jobs: forked local workers, several nodes, mpirun/srun
 *
 * Each sub-header is self-contained and is the specification of its part:
 * every function is documented where it is declared, with who owns what
 * and which errors it returns. Build with `pkg-config --cflags --libs
 * dtrain` or CMake's find_package(dtrain) (target dtrain::dtrain).
 */
#ifndef DTRAIN_H
#define DTRAIN_H

#include "dtrain/core.h"
#include "dtrain/model.h"
#include "dtrain/data.h"
#include "dtrain/optim.h"
#include "dtrain/comm.h"
#include "dtrain/engine.h"
#include "dtrain/job.h"

#endif /* DTRAIN_H */
