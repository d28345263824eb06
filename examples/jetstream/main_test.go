package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if the demo leaves a goroutine behind: its
// brokers, connections and embedded server must all be closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the demo twice, each on an embedded server of its own, and
// checks the claims its output makes: the lines that do not vary with
// timing are the same in both runs and say what they should.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS servers; skipped in -short mode")
	}
	var outs [2]string
	for i := range outs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var out bytes.Buffer
		err := run(ctx, &out, "")
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v\noutput:\n%s", i+1, err, out.String())
		}
		outs[i] = stable(out.String())
	}
	if outs[0] != outs[1] {
		t.Errorf("the lines that should not vary differ between two runs\n--- first ---\n%s\n--- second ---\n%s", outs[0], outs[1])
	}
	for _, want := range []string{
		"replica-a owns partitions [0 1]",
		"replica-b owns partitions [2 3]",
		"orders handled: 24, each once: true",
		"replica-b left; replica-a now owns partitions [0 1 2 3]",
		"all 48 orders of both batches handled: true",
		"orders handled twice: 0",
		"the server restarted on the same store",
		// Offsets count per partition: 56 orders, spread by the customers' keys.
		"committed offsets per partition: [21 7 7 21]",
		"replica-a handled 8 orders: A-200:created B-201:created C-202:created D-203:created E-204:created F-205:created G-206:created H-207:created",
		"orders handled twice, over the whole demo: 0",
	} {
		if !strings.Contains(outs[0], want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(outs[0], "every customer's orders were handled in order: true"); n != 2 {
		t.Errorf("per-customer order claimed %d times, want 2", n)
	}
	if t.Failed() {
		t.Logf("output:\n%s", outs[0])
	}
}

// stable drops the lines the demo marks as varying with timing.
func stable(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "(varies with timing)") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// TestClusterDemo runs the -cluster demo (three embedded servers, R3, one
// stopped mid-run) and checks the claims its output makes.
func TestClusterDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS servers; skipped in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := runCluster(ctx, &out); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	got := stable(out.String())
	for _, want := range []string{
		"servers n1, n2, n3; every stream, consumer and bucket the engine makes has 3 replicas",
		"replica-a owns partitions [0 1], replica-b [2 3]",
		"orders handled: 24, each once: true",
		"publishing went on: all 24 orders of the second batch were acknowledged",
		"consuming went on: all 48 orders of both batches handled: true",
		"every record handled twice came again with a higher Attempt: true",
		"every customer's orders were handled in order: true",
		"replica-c joined: replica-a owns partitions [0 1], replica-b [2], replica-c [3]",
		"all 56 orders handled: true; every record handled twice with a higher Attempt: true",
		"is back and its replicas of the partitions caught up",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}
