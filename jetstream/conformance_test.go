package jetstream

import (
	"testing"

	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

// TestConformance runs logbus's conformance suite on this engine, in real
// time (the nats.go client cannot run in synctest bubbles), with the
// capabilities it has: DropOldest (the server's discard-old), GiveBack,
// Observed, Snapshots, Batches, Redrive, StuckDetection (checked in real
// time; its timing check needs virtual time), DiscardDeadLetters, Delete, and ReclaimOnCommit as the suite defines it (committed records freed one
// at a time when room is needed; the engine-level flag also promises
// reused buffers, which this engine does not declare). MaxAge and
// MaxBytes are honoured by the server, but the suite checks them with an
// injected clock or virtual time, or counts bytes the server counts
// differently.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{
		Name:         "jetstream",
		NewBroker:    newBroker,
		Capabilities: []conformance.Capability{conformance.DropOldest, conformance.GiveBack, conformance.ReclaimOnCommit, conformance.Observed, conformance.Snapshots, conformance.Batches, conformance.Redrive, conformance.StuckDetection, conformance.DiscardDeadLetters, conformance.Delete},
	})
}
