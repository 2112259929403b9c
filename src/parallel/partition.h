/*
 * partition.h — cutting a model's layer list into P contiguous pipeline
 * stages: from cut points the user gave (model.stages), or balanced by
 * per-layer cost measured on this machine (forward + backward of each layer
 * alone, timed for a few repetitions at the micro-batch size), parameter
 * memory breaking ties. Also the one-line-per-stage description printed at
 * the start of a pipeline run.
 *
 * It does not run the pipeline (pipe.h) or talk to other ranks: the caller
 * profiles on one rank and broadcasts the costs, so every rank cuts the
 * same way.
 */
#ifndef DT_PARALLEL_PARTITION_H
#define DT_PARALLEL_PARTITION_H

#include <stddef.h>

#include "nn/nn.h"

#define DT_PIPE_MAX_STAGES 64

typedef struct dt_partition {
  int nstages;
  int first[DT_PIPE_MAX_STAGES + 1]; /* stage s holds layers [first[s], first[s+1]) */
  double cost[DT_PIPE_MAX_STAGES];   /* measured seconds per micro-batch (0: not measured) */
  size_t params[DT_PIPE_MAX_STAGES]; /* parameters of each stage */
  size_t param_off[DT_PIPE_MAX_STAGES], buf_off[DT_PIPE_MAX_STAGES], nbufs[DT_PIPE_MAX_STAGES];
} dt_partition;

/* Checks a partition request against a model of nlayers layers: nstages in
 * [1, min(nlayers, DT_PIPE_MAX_STAGES)], and when ncuts > 0 exactly
 * nstages - 1 cut points, strictly increasing, each in [1, nlayers - 1] (a
 * cut point is the 0-based index of the first layer of the next stage).
 * DT_EINVAL naming dist.pipeline_stages or model.stages. */
int dt_partition_check(int nlayers, int nstages, const int *cuts, int ncuts);

/* The partition at the given cut points (checked as above); the stage
 * sizes come from the whole model m. */
int dt_partition_from_cuts(dt_partition *p, const dt_model *m, int nstages, const int *cuts,
                           int ncuts);

/* The contiguous partition of m's layers into nstages that minimises the
 * largest stage cost (cost[l]: seconds of layer l), then the largest stage's
 * parameters. */
int dt_partition_balance(dt_partition *p, const dt_model *m, int nstages, const double *cost);

/* Measures cost[l] for every layer of spec (input c,h,w): forward and
 * backward of the layer alone over batch samples, the median of reps
 * repetitions after one warm-up. */
int dt_partition_profile(const char *spec, int c, int h, int w, int batch, int reps,
                         double *cost);

/* "stage 0: layers 1-4 (linear(2048) .. relu), 5.2M params, 3.1 ms", one
 * line per stage (newline-separated) into buf. */
void dt_partition_describe(const dt_partition *p, const dt_model *m, char *buf, size_t cap);

#endif /* DT_PARALLEL_PARTITION_H */
