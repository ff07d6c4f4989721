/* SPDX-License-Identifier: MIT */
/* Owns the agent configuration: the immutable Config struct, loading and merging the YAML files
 * (agent.yaml + conf.d drop-ins), validation with file:line:column errors, and printing the merged
 * result for --check-config.
 *
 * Files, in merge order (later wins; mappings merge key by key, scalars and lists replace):
 *   1. <root>/usr/lib/gpu-node-agent/conf.d/ *.yaml  vendor defaults (lexical order), a file of the same
 *      name in /etc/gpu-node-agent/conf.d/ masks the vendor one (like systemd drop-ins)
 *   2. <root>/etc/gpu-node-agent/agent.yaml         (absent = nothing to merge)
 *   3. <root>/etc/gpu-node-agent/conf.d/ *.yaml      (lexical order)
 * <root> is ConfigLoadOptions.root (the --root option), "/" when NULL.
 *
 * Keys (all optional):
 *   paths:
 *     root:     /            host root; every path below defaults to a path under it
 *     sys:      <root>/sys
 *     proc:     <root>/proc
 *     dev:      <root>/dev
 *     modules:  <root>/lib/modules
 *     etc:      <root>/etc
 *     run:      <root>/run                        the agent uses <run>/gpu-node-agent
 *     state:    <root>/var/lib/gpu-node-agent     persistent state
 *     pci-ids:  (unset)                          unset: udev's hwdb, then the system pci.ids; never under root
 *   nvml:
 *     library:  libnvidia-ml.so.1                 name (loader search) or absolute path
 *   labels:
 *     enabled:  true
 *     directory: <etc>/kubernetes/node-feature-discovery/features.d
 *     file:     gpu-node-agent                     plain file name: no '/', not starting with '.'
 *     expiry:   0                                  duration; >0 writes "# +expiry-time=" and refreshes
 *     mig-strategy: none                           none | single | mixed (GFD's MIG label strategies)
 *     timestamp: false                             write nvidia.com/gfd.timestamp (fixed per start/reload)
 *   sharing:                                       GPU sharing as the device plugin is configured
 *     strategy: none                               none | time-slicing | mps
 *     replicas: 1                                  >1 needs a strategy
 *     rename-by-default: false                     true: no "-SHARED" product suffix
 *   driver:                                        the kernel modules (modules/)
 *     enabled: true
 *     version: ""                                  expected driver version, "" = whatever is installed
 *     modeset: false                               also load nvidia-modeset
 *     peermem: auto                                auto | off: nvidia-peermem when a ConnectX NIC and ib_core exist
 *     parameters: {nvidia: "", nvidia-uvm: "", nvidia-modeset: "", nvidia-peermem: ""}
 *     dkms: {enabled: true, program: dkms, module: "" (NAME/VERSION, "" = autoinstall), timeout: 30min}
 *     reload-on-mismatch: never                    never | when-idle: replace a loaded driver older than
 *                                                  the installed one when no process uses a GPU
 *     kernel-module-type: auto                     auto | open | proprietary (auto: open for Blackwell+,
 *                                                  or where the 560+ branch recommends it)
 *   devices:
 *     enabled: true                                create /dev/nvidia* as nvidia-modprobe would
 *   fabric:
 *     persistenced: auto                           auto | off
 *     fabricmanager: auto                          auto | off (NVSwitch systems)
 *     timeout: 2min
 *     imex: auto                                   auto | off: IMEX channels, their CDI spec and nvidia-imex
 *                                                  where NVML puts GPUs in a fabric clique (GB200 NVL72)
 *     imex-channels: 1                             channel0..N-1 under /dev/nvidia-caps-imex-channels
 *   mig:
 *     config-file: <etc>/gpu-node-agent/mig-config.yaml   mig-parted v1 format
 *     selected: ""                                 the config to apply; "" = MIG not managed
 *     selected-from: config                        config (mig.selected) | node-label (the Kubernetes
 *                                                  node's nvidia.com/mig.config label, kube-node.c)
 *     reset: auto                                  auto | never (never: report "reboot required")
 *     hooks:
 *       stop-units: []                             units stopped around a change, started again after
 *   cdi:
 *     enabled: true
 *     spec:     <run>/cdi/nvidia.yaml              the CDI spec we own (= /var/run/cdi/nvidia.yaml)
 *     driver-root: <root>                          where the driver's user-space files are looked up
 *     imex-spec: <run>/cdi/nvidia-imex-channel.yaml   CDI spec of kind nvidia.com/imex-channel
 *     device-name-strategy: index,uuid             index | uuid | type-index, or a list (nvidia-ctk's names)
 *   gres:
 *     slurm:
 *       enabled: false                             write Slurm gres.conf lines for this node's GPUs
 *       file: <etc>/slurm/gres-gpu-node-agent.conf  Include it from gres.conf
 *   validations:
 *     operator-compat: false                       write the GPU Operator's driver-ready file
 *     directory: <run>/nvidia/validations
 *   probe:
 *     expect-gpus: 0                               GPUs this node should have; fewer on the PCI bus makes
 *                                                  the node's health degraded (0 = no expectation)
 *   health:                                        GPU health (health.c): NVML events + checks
 *     enabled: true
 *     xid:
 *       ignore: []                                 XIDs to treat as application errors (e.g. [13, 31, 43])
 *       fatal: []                                  XIDs that fail the GPU until it is reset
 *     on-unhealthy: ""                             /bin/sh -c command run when a GPU turns unhealthy, with
 *                                                  GPU_NODE_AGENT_GPU, _GPU_PCI_ADDRESS, _GPU_UUID, _HEALTH,
 *                                                  _REASON, _HOSTNAME in its environment
 *     recheck-delay: 10s                           a recoverable fault is re-checked this long after it
 *   metrics:
 *     textfile: ""                                 node_exporter textfile (absolute path ending in .prom), "" = none
 *   engine:
 *     retry-min: 1s                                first retry delay of a failed stage (doubles)
 *     retry-max: 5min                              cap of that delay
 *   log:
 *     level: info                                  emerg..debug
 *   kubernetes:                                    for mig.selected-from: node-label
 *     node-name: ""                                this node's name, "" = the host name
 *     kubeconfig: <etc>/kubernetes/kubelet.conf    credentials and API server (the kubelet's)
 *     credentials: kubeconfig                      kubeconfig | in-cluster (service account, in a pod)
 *     service-account-dir: /var/run/secrets/kubernetes.io/serviceaccount   in-cluster: token, ca.crt
 *   config:
 *     remote:                                      a drop-in fetched over HTTPS (config-remote.c)
 *       url: ""                                    https://…, may use {hostname} {machine-id} {product}
 *       ca-file: ""                                CA bundle that signs the server ("" = system CAs)
 *       cert: ""                                   client certificate (PEM) for mutual TLS
 *       key: ""                                    its private key (PEM); cert and key go together
 *       signing-key: ""                            a public key (PEM): documents must then carry a
 *                                                  detached signature by it and a serial that never goes down
 *       signature-url: ""                          where the signature is, same placeholders ("" = <url>.sig)
 *       interval: 5min                             how often the document is fetched again
 *       timeout: 30s                               the longest one fetch may take
 * The remote document may set only the keys its row in config.c's table marks .remote (policy: MIG,
 * sharing, labels, health lists, timing, log level, consumers on/off, the driver version and upgrade
 * policy); one that sets any other key is refused whole. It may also carry a top-level "serial: N",
 * which is not configuration but the document's version (signed documents must have one).
 * Durations: an integer (seconds) or a number with a unit: ms, s, min, h, d ("90s", "5min", "1h").
 * A --root on the command line overrides paths.root. Explicit paths must be absolute. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct ConfigPaths {
        char *root;
        char *sys;
        char *proc;
        char *dev;
        char *modules;
        char *etc;
        char *run;
        char *state;
        char *pci_ids;
} ConfigPaths;

typedef struct ConfigNvml {
        char *library;
        uint64_t timeout_usec;   /* one NVML call in the worker may take this long (nvmlInit more) */
} ConfigNvml;

typedef enum MigStrategy {
        MIG_STRATEGY_NONE,
        MIG_STRATEGY_SINGLE,
        MIG_STRATEGY_MIXED,
        _MIG_STRATEGY_MAX,
        _MIG_STRATEGY_INVALID = -EINVAL,
} MigStrategy;

typedef enum SharingStrategy {
        SHARING_NONE,
        SHARING_TIME_SLICING,
        SHARING_MPS,
        _SHARING_STRATEGY_MAX,
        _SHARING_STRATEGY_INVALID = -EINVAL,
} SharingStrategy;

typedef struct ConfigLabels {
        bool enabled;
        char *directory;
        char *file;
        uint64_t expiry_usec; /* 0 = no expiry directive */
        int mig_strategy;     /* MigStrategy */
        bool timestamp;
} ConfigLabels;

typedef struct ConfigSharing {
        int strategy;         /* SharingStrategy */
        unsigned replicas;
        bool rename_by_default;
} ConfigSharing;

typedef enum DriverModule {
        DRIVER_MODULE_NVIDIA,
        DRIVER_MODULE_UVM,
        DRIVER_MODULE_MODESET,
        DRIVER_MODULE_PEERMEM,
        _DRIVER_MODULE_MAX,
        _DRIVER_MODULE_INVALID = -EINVAL,
} DriverModule;

typedef struct ConfigDriver {
        bool enabled;
        char *version;                         /* expected driver version, "" = any */
        bool modeset;                          /* also load nvidia-modeset */
        int peermem;                           /* 0 off, 1 auto */
        char *parameters[_DRIVER_MODULE_MAX];  /* extra module options, "" none */
        bool dkms_enabled;
        char *dkms_program;
        char *dkms_module;                     /* NAME/VERSION, "" = dkms autoinstall */
        uint64_t dkms_timeout_usec;
        int reload_on_mismatch;                /* 0 never, 1 when-idle */
        int kernel_module_type;                /* 0 auto, 1 open, 2 proprietary */
} ConfigDriver;

typedef struct ConfigDevices {
        bool enabled;
} ConfigDevices;

typedef struct ConfigFabric {
        int persistenced;                      /* 0 off, 1 auto (start when installed) */
        int fabricmanager;                     /* 0 off, 1 auto (start on NVSwitch systems) */
        uint64_t timeout_usec;
        int imex;                              /* 0 off, 1 auto (IMEX channels + nvidia-imex where GPUs are in a clique) */
        unsigned imex_channels;                /* channel0..N-1 are created */
} ConfigFabric;

typedef struct ConfigMig {
        char *config_file;                     /* mig-parted v1 file */
        char *selected;                        /* config name, "" = MIG not managed */
        int reset;                             /* 0 never, 1 auto */
        char **stop_units;                     /* units stopped around a change */
        int selected_from;                     /* MigSelectedFrom */
} ConfigMig;

typedef enum MigSelectedFrom {
        MIG_SELECTED_FROM_CONFIG,
        MIG_SELECTED_FROM_NODE_LABEL,
        _MIG_SELECTED_FROM_MAX,
        _MIG_SELECTED_FROM_INVALID = -EINVAL,
} MigSelectedFrom;

typedef enum KubeCredentials {
        KUBE_CREDENTIALS_KUBECONFIG,           /* kubernetes.kubeconfig */
        KUBE_CREDENTIALS_IN_CLUSTER,           /* a pod's service account, KUBERNETES_SERVICE_HOST/PORT */
        _KUBE_CREDENTIALS_MAX,
} KubeCredentials;

typedef struct ConfigKubernetes {
        char *node_name;                       /* "" = the host name */
        char *kubeconfig;
        int credentials;                       /* KubeCredentials */
        char *service_account_dir;             /* in-cluster: token and ca.crt */
} ConfigKubernetes;

/* cdi.device-name-strategy: which names each device gets, as nvidia-ctk's --device-name-strategy (bits,
 * in the order the key's values are listed). */
typedef enum CdiDeviceNames {
        CDI_NAMES_INDEX = 1 << 0,              /* "index": "0", and "0:1" for MIG device 1 of GPU 0 */
        CDI_NAMES_UUID = 1 << 1,               /* "uuid": "GPU-…", "MIG-…" */
        CDI_NAMES_TYPE_INDEX = 1 << 2,         /* "type-index": "gpu0", "mig0:1" */
} CdiDeviceNames;
#define CDI_NAMES_DEFAULT (CDI_NAMES_INDEX | CDI_NAMES_UUID) /* nvidia-ctk's default "index,uuid" */

typedef struct ConfigCdi {
        bool enabled;
        char *spec;
        char *driver_root;
        char *imex_spec;                       /* kind nvidia.com/imex-channel, its own file */
        unsigned device_names;                 /* CdiDeviceNames bits, never 0 */
} ConfigCdi;

typedef struct ConfigGres {
        bool slurm_enabled;
        char *slurm_file;                      /* gres.conf lines for slurmd (Include it from gres.conf) */
} ConfigGres;

typedef struct ConfigValidations {
        bool operator_compat;                  /* write the GPU Operator's validation files */
        char *directory;                       /* <run>/nvidia/validations */
} ConfigValidations;

typedef struct ConfigEngine {
        uint64_t retry_min_usec;
        uint64_t retry_max_usec;
} ConfigEngine;

typedef struct ConfigProbe {
        unsigned expect_gpus;                  /* GPUs this node should have, 0 = no expectation */
} ConfigProbe;

typedef struct ConfigHealth {
        bool enabled;                          /* watch NVML events and run health checks */
        char **xid_ignore;                     /* decimal XIDs treated as application errors */
        char **xid_fatal;                      /* decimal XIDs that fail the GPU until it is reset */
        char *on_unhealthy;                    /* /bin/sh -c command run when a GPU turns unhealthy, "" none */
        uint64_t recheck_delay_usec;           /* a recoverable fault is re-checked this long after it */
} ConfigHealth;

typedef struct ConfigMetrics {
        char *textfile;                        /* node_exporter textfile, "" = none */
} ConfigMetrics;

typedef struct ConfigRemote {
        char *url;                             /* template, "" = no remote configuration */
        char *ca_file;
        char *cert;
        char *key;
        char *signing_key;                     /* public key (PEM) documents must be signed with, "" = unsigned ok */
        char *signature_url;                   /* template of the detached signature, "" = <url>.sig */
        uint64_t interval_usec;
        uint64_t timeout_usec;
} ConfigRemote;

typedef struct Config {
        ConfigPaths paths;       /* all resolved to absolute paths */
        ConfigNvml nvml;
        ConfigLabels labels;
        ConfigSharing sharing;
        ConfigDriver driver;
        ConfigDevices devices;
        ConfigFabric fabric;
        ConfigMig mig;
        ConfigCdi cdi;
        ConfigGres gres;
        ConfigValidations validations;
        ConfigEngine engine;
        int log_level;           /* LOG_* from syslog.h */
        ConfigRemote remote;
        ConfigKubernetes kubernetes;
        ConfigProbe probe;
        ConfigHealth health;
        ConfigMetrics metrics;
        char **sources;          /* files that were merged, in order (may be empty) */
} Config;

typedef struct ConfigLoadOptions {
        const char *root;        /* --root, or NULL */
        const char *main_file;   /* NULL: <root>/etc/gpu-node-agent/agent.yaml */
        char **dropin_dirs;      /* NULL: the two default conf.d directories; otherwise these, in order,
                                  * with the same masking rule (a later dir's file masks an earlier
                                  * one's of the same name) */
        /* The remote document (config.remote), merged after agent.yaml and before the last drop-in
         * directory (local /etc drop-ins win). remote_name (the URL) stands for the file in messages
         * and in sources. NULL: none. */
        const char *remote_name;
        const char *remote_data;
        size_t remote_size;
        /* Skip the checks across keys (config_verify): for a first look at the local files only, which
         * the remote document may complete (sharing.replicas here, sharing.strategy there). */
        bool partial;
} ConfigLoadOptions;

/* Loads, merges and validates. On failure returns a negative errno (-EINVAL for invalid content,
 * -EBADMSG for malformed YAML, or the errno of an unreadable file) and sets *ret_error to one line
 * such as "/etc/gpu-node-agent/conf.d/10-x.yaml:4:3: unknown key 'labels.fo'". */
int config_load(const ConfigLoadOptions *o, Config **ret, char **ret_error);
/* The built-in defaults alone, resolved under root (NULL: "/"), as if no file existed. */
int config_load_defaults(const char *root, Config **ret);

Config *config_free(Config *c);

/* Prints the merged, resolved configuration as YAML (with the source files as a comment). */
int config_dump(const Config *c, FILE *f);

/* The key table as the reference documents it, one "KEY\tDEFAULT\tREMOTE" line per key: DEFAULT as
 * the docs write it (<etc>/… for a derived path, [] for an empty list), REMOTE "yes" or "no (WHY)"
 * (tests/docs/test-config-keys.py keeps docs/configuration.md and the man page in agreement with it). */
int config_keys_dump(FILE *f);

/* The top-level "serial: N" of a remote document (name for messages), which config_load() takes and
 * ignores: -ENOENT when there is none, -EINVAL with *ret_error when it is malformed. */
int config_remote_document_serial(const char *name, const char *data, size_t size, uint64_t *ret,
                                  char **ret_error);

const char *mig_strategy_to_string(MigStrategy s);
const char *sharing_strategy_to_string(SharingStrategy s);

/* Parses a duration as described above into microseconds; -EINVAL if malformed. */
int config_parse_duration(const char *s, uint64_t *ret_usec);
