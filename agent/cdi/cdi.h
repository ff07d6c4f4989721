/* SPDX-License-Identifier: MIT */
/* Owns the CDI (Container Device Interface) spec the agent writes for kind nvidia.com/gpu: the in-memory
 * model (CdiSpec), building it from an NVML snapshot and the node's files, emitting it as deterministic
 * YAML, our own checker of the CDI loader's rules, and the careful writer (atomic, only when changed,
 * refusing to fight another producer). See README.md, "CDI".
 *
 * How paths map when the agent looks at a node through a root directory (--root, paths.root = R,
 * cdi.driver-root = D, by default D = R):
 *   - the spec describes the node as the node itself sees it, from its own "/";
 *   - a mount's hostPath is the file we found with R stripped (D/usr/lib/libcuda.so.X → with D = R:
 *     /usr/lib/libcuda.so.X; with D = R/run/nvidia/driver: /run/nvidia/driver/usr/lib/libcuda.so.X);
 *   - a mount's containerPath is the same file with D stripped (/usr/lib/libcuda.so.X): the driver's
 *     files appear in the container where they would be on a node with the driver installed natively;
 *   - device nodes are looked up under paths.dev and written as "/dev/<name>" (no hostPath): a node's
 *     device nodes are always at its /dev, and runtimes stat them to fill in type, major and minor;
 *   - a path outside R (explicitly configured elsewhere) is written as it is. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu-nvml.h"
#include "macro.h"

#define CDI_KIND "nvidia.com/gpu"

typedef struct CdiDeviceNode {
        char *path;
        char *host_path;
        char *type;
        char *permissions;
        int64_t major, minor;        /* 0 = absent, as in the loader */
        bool has_file_mode, has_uid, has_gid;
        uint32_t file_mode, uid, gid;
} CdiDeviceNode;

typedef struct CdiMount {
        char *host_path;
        char *container_path;
        char **options;
        char *type;
} CdiMount;

typedef struct CdiHook {
        char *hook_name;
        char *path;
        char **args;
        char **env;
        bool has_timeout;
        int64_t timeout;
} CdiHook;

typedef struct CdiNetDevice {
        char *host_interface_name;
        char *name;
} CdiNetDevice;

typedef struct CdiIntelRdt {
        char *clos_id;
        bool has_schemata, enable_monitoring, enable_cmt, enable_mbm;
        bool seen_enable_cmt, seen_enable_mbm; /* the key was present, whatever its value */
} CdiIntelRdt;

typedef struct CdiEdits {
        char **env;
        CdiDeviceNode *device_nodes;
        size_t n_device_nodes;
        CdiMount *mounts;
        size_t n_mounts;
        CdiHook *hooks;
        size_t n_hooks;
        CdiNetDevice *net_devices;
        size_t n_net_devices;
        CdiIntelRdt *intel_rdt;      /* NULL when absent */
        uint32_t *additional_gids;
        size_t n_additional_gids;
} CdiEdits;

typedef struct CdiDevice {
        char *name;
        char **annotations;          /* key, value, key, value, … */
        CdiEdits edits;
} CdiDevice;

typedef struct CdiSpec {
        char *version;               /* cdiVersion */
        char *kind;
        char **annotations;          /* key, value, … */
        CdiDevice *devices;
        size_t n_devices;
        CdiEdits edits;
} CdiSpec;

CdiSpec *cdi_spec_free(CdiSpec *s);
DEFINE_CLEANUP_FUNC(CdiSpec *, cdi_spec_free);
void cdi_edits_done(CdiEdits *e);

/* The lowest cdiVersion the content needs, by the loader's rules ("0.3.0" … "1.1.0"); a static string. */
const char *cdi_spec_min_version(const CdiSpec *s);
/* Compares two "X.Y.Z" versions (a leading "v" is ignored): <0, 0, >0. */
int cdi_version_compare(const char *a, const char *b);
bool cdi_version_is_known(const char *v);

/* The spec as YAML: a header comment, then keys in alphabetical order at every level (as the toolkit's
 * files have them); strings are quoted only when YAML would read them as something else. */
int cdi_spec_to_yaml(const CdiSpec *s, char **ret);

/* The parsed driver/nvidia-caps/mig-minors table, kept by its owner (the Manager) from one build to
 * the next while the file is unchanged. */
typedef struct CdiMigMinorsCache CdiMigMinorsCache;
CdiMigMinorsCache *cdi_mig_minors_cache_free(CdiMigMinorsCache *c);

/* What the builder looks at. Paths are this process's view (may be under a --root); see the top. */
typedef struct CdiBuildInput {
        const NvmlSnapshot *snapshot;
        const char *root;            /* paths.root; stripped from host paths ("/" = nothing to strip) */
        const char *dev;             /* paths.dev */
        const char *proc;            /* paths.proc: driver/nvidia-caps/mig-minors */
        const char *sys;             /* paths.sys: bus/pci/devices/<bdf>/drm */
        const char *run;             /* paths.run: nvidia-persistenced/socket */
        const char *driver_root;     /* cdi.driver-root */
        CdiMigMinorsCache **minors_cache; /* optional: where the mig-minors table is kept between builds */
        unsigned device_names;       /* cdi.device-name-strategy: CdiDeviceNames bits of config.h; 0 = "index,uuid" */
} CdiBuildInput;

/* Builds the nvidia.com/gpu spec: devices "N" and "GPU-<uuid>" per full GPU (nvml_index), "N:M" and
 * "MIG-<uuid>" per MIG device (or the names device_names asks for: "gpuN", "migN:M" for type-index), and
 * "all"; a GPU in MIG mode has no whole-GPU entry, as from nvidia-ctk v1.18 on; common edits with the control nodes, driver libraries, firmware,
 * binaries, persistenced socket and (when nvidia-cdi-hook exists) hooks. Things that could not be
 * described (a GPU without a minor, a MIG device whose caps minors are unknown, no driver libraries) are
 * left out with one line each in *ret_warnings. -ENODEV when not a single device could be described. */
int cdi_spec_build(const CdiBuildInput *in, CdiSpec **ret, char ***ret_warnings);

/* Parses CDI spec text (YAML or JSON; name is used in messages) into the model, rejecting what the
 * loader's strict decoding rejects (unknown fields, wrong types, duplicate keys). */
int cdi_spec_parse(const char *name, const char *data, size_t size, CdiSpec **ret, char **ret_error);

/* Checks the CDI loader's content rules 1–11 (listed in cdi-validate.c) on a parsed spec. */
int cdi_spec_check(const CdiSpec *s, char **ret_error);

/* cdi_spec_parse + cdi_spec_check. Returns 0, or -EINVAL/-EBADMSG with *ret_error set to
 * "NAME: <what is wrong> (<where>)". */
int cdi_validate_text(const char *name, const char *data, size_t size, char **ret_error);

/* The kind a spec file declares, read leniently (NULL when the file has none or does not parse). */
int cdi_file_kind(const char *path, char **ret_kind);

/* Refuses to write when someone else would write the same kind into our directory:
 *   -EEXIST  another .yaml/.json file in the spec's directory declares kind CDI_KIND (both paths named),
 *   -EBUSY   <etc>/systemd/system/<x>.wants/nvidia-cdi-refresh.path exists (the toolkit's unit is enabled).
 * *ret_error says which, and how to fix it. */
int cdi_check_conflicts(const char *spec_path, const char *etc_dir, char **ret_error);

/* Validates text, then writes it to path atomically (temp ".NAME.XXXXXX" in the same directory, which
 * the loaders ignore, then rename), mode 0644, creating the directory when its parent exists. Does not
 * touch the file when it already holds exactly these bytes: *ret_changed tells which. */
int cdi_spec_write(const char *path, const char *text, bool *ret_changed, char **ret_error);

/* Removes our spec at path (and temp files a killed write left): 0 when removed, -ENOENT when there
 * was none. Anything but a regular file under that name (a symlink, a FIFO) was not written by us and
 * stays: -EEXIST with *ret_error naming it. */
int cdi_spec_remove(const char *path, char **ret_error);
