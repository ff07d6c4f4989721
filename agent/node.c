/* SPDX-License-Identifier: MIT */
/* Owns the string table of AgentState (node.h). */
#include "node.h"
#include "string-table.h"

static const char *const agent_state_names[_AGENT_STATE_MAX] = {
        [AGENT_STARTING] = "starting",
        [AGENT_READY] = "ready",
        [AGENT_DEGRADED] = "degraded",
        [AGENT_FAILED] = "failed",
};

DEFINE_STRING_TABLE_LOOKUP(agent_state, AgentState, agent_state_names, _AGENT_STATE_MAX, _AGENT_STATE_INVALID)
