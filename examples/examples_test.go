// Package examples_test builds and runs the example programs under
// examples/ and checks the lines of their output that carry the story, so a
// change to logbus that breaks a demo newcomers are told to run fails CI.
package examples_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runTimeout bounds building and running one program. The programs finish
// in well under a second; the build may take longer on a cold cache.
const runTimeout = 60 * time.Second

func TestOrders(t *testing.T) {
	t.Parallel()
	out := runTwice(t, "./orders")
	mustContain(t, out,
		"alice:created  -> partition 1, offset 0",
		"bob:cancelled  -> partition 0, offset 1",
		"carol:created  -> partition 1, offset 3",
		"billing received 6 records",
		"audit received 6 records",
		"alice's events reached billing in order: created -> paid -> shipped",
		"shipping stats: {Delivered:5 Retried:3 DeadLettered:1 Skipped:0",
		"alice:paid was attempted 2 times",
		"shipping acked on partition 1: alice:created@0, alice:paid@1, alice:shipped@2, carol:created@3",
		"dead letter: bob:cancelled (partition 0, offset 1) after 3 attempts: order B-1 was cancelled: nothing to ship",
		"lag before replay: billing=0 audit=0 shipping=0",
		"billing after replay: 12 records received",
		"audit after billing's replay: 6 records received",
		"state=stopped",
		"publish after Close: refused with ErrClosed",
		"dead letters kept by shipping: 1",
		`Flush: logbus: flush topic "receipts": 2 records failed, the first: partition full`,
		"errors.Is(err, pubsub.ErrBackpressure) = true",
		"receipt 3 -> offset 2",
		"receipt 4 -> not stored: ErrBackpressure",
		"receipt 5 -> not stored: ErrBackpressure",
		"Flush again: <nil>",
		"the printer, back online, printed 5 receipts",
		"Close with a 50ms deadline returned by it: true",
		"errors.Is(err, context.DeadlineExceeded) = true",
		"left behind: group mailer partition 0 committed 0 end 2, handler still running: true",
		"mailer's offset is still 0",
	)
}

func TestSignups(t *testing.T) {
	t.Parallel()
	out := runTwice(t, "./signups")
	mustContain(t, out,
		"u08 -> partition 0, offset 3",
		"u09 -> rejected: ErrBackpressure",
		"u10 -> rejected: ErrBackpressure",
		"Blocked:2 TimedOut:2",
		"analytics lag: 8",
		"u09 -> partition 0, offset 4",
		"u10 -> partition 1, offset 4",
		"email sent 10 welcome emails: u01 u02 u03 u04 u05 u06 u07 u08 u09 u10",
		"audit (a Stream) recorded 10 signups",
		"analytics counted 10 signups: free=5 pro=5",
		"Dropped:6",
		"Skipped:6",
		"dashboard saw: u07 u08 u09 u10",
		"state=stopped",
	)
}

func TestKeyConcurrency(t *testing.T) {
	t.Parallel()
	out := runTwice(t, "./keyconcurrency")
	mustContain(t, out,
		"one at a time: 40 payments, at most 1 at once, each customer's in order: true",
		"8 at a time:   40 payments, at most 8 at once, each customer's in order: true",
		"8 at a time was at least 4x faster: true",
		"while carol-1 waited for its retry, the other customers' payments went through: 35 of 35",
		"carol's payments, in order: carol-1 carol-2 carol-3 carol-4 carol-5",
		"each customer's in order: true",
	)
}

// runTwice builds the program in dir (relative to this directory) and runs
// it twice. It fails the test unless both runs succeed with the same output,
// and returns that output.
func runTwice(t *testing.T, dir string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs a program; skipped in -short mode")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()

	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race") // the demos must be race-free too
	}
	run(ctx, t, exec.CommandContext(ctx, goBin, append(args, dir)...))

	first := run(ctx, t, exec.CommandContext(ctx, bin))
	second := run(ctx, t, exec.CommandContext(ctx, bin))
	if first != second {
		t.Errorf("%s: output differs between two runs\n--- first ---\n%s\n--- second ---\n%s", dir, first, second)
	}
	return first
}

// run runs cmd and returns its standard output, failing the test with its
// standard error when it does not exit with status 0.
func run(ctx context.Context, t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		t.Fatalf("%s: %v\nstderr:\n%s\nstdout:\n%s", strings.Join(cmd.Args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.String()
}

// mustContain fails the test for every line of want that out lacks.
func mustContain(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// TestREADMEQuickStart keeps the README's quick start honest: it must be the
// code of examples/quickstart, which this package builds and runs.
func TestREADMEQuickStart(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join("quickstart", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	code := src[bytes.Index(src, []byte("package main")):]
	if !bytes.Contains(readme, code) {
		t.Error("README.md does not show examples/quickstart/main.go (from `package main` on): update the README")
	}
	if testing.Short() {
		return
	}
	out := runTwice(t, "./quickstart")
	if !bytes.Contains(readme, []byte(out)) {
		t.Errorf("README.md does not show the quick start's output:\n%s", out)
	}
}
