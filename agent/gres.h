/* SPDX-License-Identifier: MIT */
/* Owns the Slurm GRES description of the node: gres.conf lines for every full GPU and every MIG device
 * NVML reports, with the CPUs local to each GPU, in the form slurmd (22.05+) reads, and keeping the file
 * that holds them (gres.slurm.file) in step without churn. Library-like: returns errors, logs nothing
 * above debug. */
#pragma once

#include <stdbool.h>

#include "gpu-nvml.h"

typedef struct GresInput {
        const NvmlSnapshot *snapshot;  /* GPUs in our index order; NULL = none known */
        const char *sys;               /* sysfs mount: <sys>/bus/pci/devices/<bdf>/local_cpulist, cpu topology */
        const char *proc;              /* <proc>/driver/nvidia-caps/mig-minors */
        const char *dev;               /* device directory as slurmd sees it (paths.dev) */
} GresInput;

/* Formats the file. One line per full GPU not in MIG mode:
 *   Name=gpu Type=<model> File=<dev>/nvidia<minor> Cores=<list>
 * and one per MIG device of a GPU in MIG mode:
 *   Name=gpu Type=<model>_<profile> MultipleFiles=<dev>/nvidia<minor>,<dev>/nvidia-caps/nvidia-cap<gi>,<dev>/nvidia-caps/nvidia-cap<ci>
 * <model> is NVML's name as Slurm's AutoDetect=nvml spells it (lower case, blanks as '_'), so a
 * slurm.conf written for autodetection keeps working; '#', '=', ',', quotes, backslashes, control
 * characters and non-ASCII bytes also become '_', so that no name can end the line, start a comment or
 * add a key. A GPU or MIG device that cannot be described
 * (no minor, no profile, not in mig-minors) is left out with a line in *ret_warnings. Returns the number
 * of GPUs and MIG devices described; with 0 the text is only its header comment (no GPU is no GRES). */
int gres_format(const GresInput *in, char **ret_text, char ***ret_warnings);

/* "NVIDIA H100 80GB HBM3" → "nvidia_h100_80gb_hbm3". NULL on OOM. */
char *gres_type_name(const char *nvml_name);

/* The cores of a cpulist ("0-55,112-167") that are the first thread of their core, by
 * <sys>/devices/system/cpu/cpu<N>/topology/thread_siblings_list (a CPU without that file counts as a
 * core of its own), as a cpulist again ("0-55"). -EINVAL for a malformed list. */
int gres_cores_from_cpulist(const char *sys, const char *cpulist, char **ret);

/* Writes text to path atomically (temp file in the same directory, mode 0644) when the file's bytes
 * differ; *ret_changed says whether it did. Creates the parent directory. */
int gres_write(const char *path, const char *text, bool *ret_changed);
