package uninstall

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Owner is the DaemonSet that runs the agent, from its pod's controller
// reference.
type Owner struct {
	Namespace, Name string
	UID             types.UID
}

// Observation is what the agent last learned of its DaemonSet's name in
// the API (from its watch, or a read at shutdown).
type Observation struct {
	// Known is false until the API answered once.
	Known bool
	// Exists is false when no DaemonSet has the name (NotFound, or its
	// deletion was seen).
	Exists bool
	// UID and Deleting describe the DaemonSet found.
	UID      types.UID
	Deleting bool
	// At is when the API said so.
	At time.Time
}

// Verdict is what a stopping agent does with its table.
type Verdict int

const (
	// Keep the table: an update or a restart (a successor takes over), or
	// it cannot be told (fail closed: protection is never removed on a
	// guess).
	Keep Verdict = iota
	// Remove the table: the DaemonSet is going away.
	Remove
)

// Decide says whether an agent owned by owner removes its table, given what
// it knows of the DaemonSet, with the reason in words. Only a DaemonSet
// that is gone, or is being deleted, removes: a DaemonSet of the same name
// with another UID is a new installation whose agent takes the node over
// (removing the table would open the node until that agent's next sync).
func Decide(owner Owner, obs Observation) (Verdict, string) {
	name := owner.Namespace + "/" + owner.Name
	switch {
	case !obs.Known:
		return Keep, fmt.Sprintf("the API never said whether DaemonSet %s exists", name)
	case !obs.Exists:
		return Remove, fmt.Sprintf("DaemonSet %s no longer exists", name)
	case obs.UID != owner.UID && !obs.Deleting:
		return Keep, fmt.Sprintf("DaemonSet %s was re-created (UID %s, this agent's is %s); its agent takes the node over", name, obs.UID, owner.UID)
	case obs.Deleting:
		return Remove, fmt.Sprintf("DaemonSet %s is being deleted", name)
	}
	return Keep, fmt.Sprintf("DaemonSet %s exists (an update or a restart)", name)
}
