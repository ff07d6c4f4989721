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
 *     pci-ids:  /usr/share/misc/pci.ids          the agent's own data, not under root
 *   nvml:
 *     library:  libnvidia-ml.so.1                 name (loader search) or absolute path
 *   labels:
 *     enabled:  true
 *     directory: <etc>/kubernetes/node-feature-discovery/features.d
 *     file:     gpu-node-agent                     plain file name: no '/', not starting with '.'
 *     expiry:   0                                  duration; >0 writes "# +expiry-time=" and refreshes
 *   engine:
 *     retry-min: 1s                                first retry delay of a failed stage (doubles)
 *     retry-max: 5min                              cap of that delay
 *   log:
 *     level: info                                  emerg..debug
 * Durations: an integer (seconds) or a number with a unit: ms, s, min, h, d ("90s", "5min", "1h").
 * A --root on the command line overrides paths.root. Explicit paths must be absolute. */
#pragma once

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
} ConfigNvml;

typedef struct ConfigLabels {
        bool enabled;
        char *directory;
        char *file;
        uint64_t expiry_usec; /* 0 = no expiry directive */
} ConfigLabels;

typedef struct ConfigEngine {
        uint64_t retry_min_usec;
        uint64_t retry_max_usec;
} ConfigEngine;

typedef struct Config {
        ConfigPaths paths;       /* all resolved to absolute paths */
        ConfigNvml nvml;
        ConfigLabels labels;
        ConfigEngine engine;
        int log_level;           /* LOG_* from syslog.h */
        char **sources;          /* files that were merged, in order (may be empty) */
} Config;

typedef struct ConfigLoadOptions {
        const char *root;        /* --root, or NULL */
        const char *main_file;   /* NULL: <root>/etc/gpu-node-agent/agent.yaml */
        char **dropin_dirs;      /* NULL: the two default conf.d directories; otherwise these, in order,
                                  * with the same masking rule (a later dir's file masks an earlier
                                  * one's of the same name) */
} ConfigLoadOptions;

/* Loads, merges and validates. On failure returns a negative errno (-EINVAL for invalid content,
 * -EBADMSG for malformed YAML, or the errno of an unreadable file) and sets *ret_error to one line
 * such as "/etc/gpu-node-agent/conf.d/10-x.yaml:4:3: unknown key 'labels.fo'". */
int config_load(const ConfigLoadOptions *o, Config **ret, char **ret_error);

Config *config_free(Config *c);

/* Prints the merged, resolved configuration as YAML (with the source files as a comment). */
int config_dump(const Config *c, FILE *f);

/* Parses a duration as described above into microseconds; -EINVAL if malformed. */
int config_parse_duration(const char *s, uint64_t *ret_usec);
