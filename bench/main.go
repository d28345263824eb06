// Command bench compares logbus with other ways of moving messages between
// goroutines of one process: raw buffered channels, watermill's gochannel,
// NATS core and NATS JetStream (both with an embedded, in-process server).
//
// It runs three scenarios for every peer, interleaved in one process (round
// robin over the peers within each repetition, so that a slow drift of the
// machine hits every peer alike), checks that every message was delivered,
// and prints a markdown table of medians. See README.md.
//
// It is its own module so that the library's go.mod never gains the peers'
// dependencies.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/stats"
)

// scenario is a shape of traffic. groups is the number of consumer groups
// (each sees every message); consumers is the number of consumers in each
// group (they share its partitions).
type scenario struct {
	name       string
	desc       string
	producers  int
	partitions int
	groups     int
	consumers  int
	// pace is the total publish rate, messages a second over all producers,
	// for the latency runs; 0 publishes as fast as the peer takes them.
	pace float64
}

var allScenarios = []scenario{
	{name: "S1", desc: "1 producer → 1 partition → 1 group (1 consumer)", producers: 1, partitions: 1, groups: 1, consumers: 1},
	{name: "S2", desc: "1 producer → 1 partition → 4 groups (1 consumer each)", producers: 1, partitions: 1, groups: 4, consumers: 1},
	{name: "S3", desc: "4 producers → 4 partitions → 1 group of 4 consumers", producers: 4, partitions: 4, groups: 1, consumers: 4},
}

// peer is one system under comparison. run does one complete run: set up,
// publish n messages, wait until every group has them, tear down. Every
// goroutine it starts has ended when it returns (main checks).
// It returns errSkip for a scenario the peer does not take part in.
type peer interface {
	name() string
	run(sc scenario, n int) (result, error)
}

// traits is what main needs to know about a peer beyond the interface.
type traits struct {
	// slow peers get -n-slow messages per run instead of -n, to keep the
	// whole run within a couple of minutes.
	slow bool
	// atLeastOnce peers may legitimately redeliver; duplicates are then
	// reported, not treated as a failure.
	atLeastOnce bool
}

type describer interface{ traits() traits }

func traitsOf(p peer) traits {
	if d, ok := p.(describer); ok {
		return d.traits()
	}
	return traits{}
}

var errSkip = errors.New("scenario not run by this peer")

var (
	flagScenarios = flag.String("scenarios", "S1,S2,S3", "comma-separated scenarios to run")
	flagPeers     = flag.String("peers", "chan,chan-batch,logbus,logbus-batch,logbus-batch-consumer,logbus-raw,logbus-json,watermill,nats,jetstream", "comma-separated peers to run")
	flagN         = flag.Int("n", 300_000, "messages per run for the fast peers")
	flagNSlow     = flag.Int("n-slow", 30_000, "messages per run for the slow peers (watermill, jetstream)")
	flagReps      = flag.Int("reps", 3, "repetitions; the table reports medians")
	flagLatency   = flag.Bool("latency", true, "also run the paced latency runs at half of each peer's median max rate")
	flagTimeout   = flag.Duration("timeout", 60*time.Second, "longest wait for one run's deliveries")
	flagNATSTCP   = flag.Bool("nats-tcp", false, "connect NATS clients over TCP on 127.0.0.1 instead of the in-process pipe")
	flagCPUProf   = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (narrow it with -peers and -scenarios)")
	flagMemProf   = flag.String("memprofile", "", "write an allocation profile (alloc_space/alloc_objects) at the end to this file")
)

func main() {
	flag.Parse()
	if err := mainErr(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func mainErr() error {
	if *flagN < 1 || *flagNSlow < 1 || *flagReps < 1 {
		return errors.New("-n, -n-slow and -reps must be at least 1")
	}
	scs, err := pick(allScenarios, *flagScenarios, func(s scenario) string { return s.name })
	if err != nil {
		return err
	}
	all := []peer{
		chanPeer{},
		chanPeer{batch: batchSize},
		logbusPeer{},
		logbusPeer{batch: batchSize},
		logbusPeer{batch: batchSize, consumer: true},
		logbusPeer{raw: true},
		logbusPeer{json: true},
		watermillPeer{},
		natsPeer{tcp: *flagNATSTCP},
		jetstreamPeer{tcp: *flagNATSTCP},
	}
	peers, err := pick(all, *flagPeers, peer.name)
	if err != nil {
		return err
	}

	if *flagCPUProf != "" {
		f, err := os.Create(*flagCPUProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *flagMemProf != "" {
		defer func() {
			if f, err := os.Create(*flagMemProf); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}

	b := &bench{thr: map[key][]result{}, lat: map[key][]latency{}}
	started := time.Now()

	// Throughput: every repetition visits every scenario and every peer once.
	for rep := range *flagReps {
		for _, sc := range scs {
			for _, p := range peers {
				b.throughput(rep, sc, p)
			}
		}
	}
	// Latency: paced at half the median rate just measured. A separate
	// phase, because "half of the maximum" needs the maximum first.
	if *flagLatency {
		for rep := range *flagReps {
			for _, sc := range scs {
				for _, p := range peers {
					b.latency(rep, sc, p)
				}
			}
		}
	}

	b.print(scs, peers, time.Since(started))
	if len(b.failures) > 0 {
		return fmt.Errorf("%d run(s) failed; see above", len(b.failures))
	}
	return nil
}

// batchSize is how many messages chan-batch sends per channel send and
// logbus-batch publishes per call.
const batchSize = 64

type key struct{ sc, peer string }

type latency struct{ p50, p99 float64 }

type bench struct {
	thr      map[key][]result
	lat      map[key][]latency
	failures []string
	notes    []string
}

func count(p peer) int {
	if traitsOf(p).slow {
		return *flagNSlow
	}
	return *flagN
}

func (b *bench) fail(what string, err error) {
	msg := fmt.Sprintf("%s: %v", what, err)
	fmt.Fprintln(os.Stderr, "FAILED:", msg)
	b.failures = append(b.failures, msg)
}

func (b *bench) throughput(rep int, sc scenario, p peer) {
	what := fmt.Sprintf("%s %s rep %d", sc.name, p.name(), rep+1)
	res, err := runChecked(p, sc, count(p))
	if errors.Is(err, errSkip) {
		return
	}
	if err != nil {
		b.fail(what, err)
		return
	}
	if res.dups > 0 {
		b.notes = append(b.notes, fmt.Sprintf("%s: %d duplicate deliveries (allowed: at-least-once)", what, res.dups))
	}
	k := key{sc.name, p.name()}
	b.thr[k] = append(b.thr[k], res)
	fmt.Fprintf(os.Stderr, "%-28s %12.0f msgs/s %8.2f allocs/msg %s\n", what, rate(res), allocs(res), res.diag)
}

func (b *bench) latency(rep int, sc scenario, p peer) {
	what := fmt.Sprintf("%s %s latency rep %d", sc.name, p.name(), rep+1)
	k := key{sc.name, p.name()}
	max, ok := b.medianRate(k)
	if !ok {
		return // skipped or failed in the throughput phase
	}
	sc.pace = max / 2
	res, err := runChecked(p, sc, count(p))
	if errors.Is(err, errSkip) {
		return
	}
	if err == nil && len(res.lat) == 0 {
		err = errors.New("no latency samples")
	}
	if err != nil {
		b.fail(what, err)
		return
	}
	if res.dups > 0 {
		b.notes = append(b.notes, fmt.Sprintf("%s: %d duplicate deliveries (allowed: at-least-once)", what, res.dups))
	}
	q := stats.Quantiles(res.lat, 0.5, 0.99)
	b.lat[k] = append(b.lat[k], latency{q[0], q[1]})
	fmt.Fprintf(os.Stderr, "%-28s at %10.0f msgs/s  p50 %s  p99 %s (%d samples, achieved %.0f msgs/s) %s\n",
		what, sc.pace, fmtNS(q[0]), fmtNS(q[1]), len(res.lat), rate(res), res.diag)
}

// runChecked runs p and then checks what a run must leave behind: no
// duplicates from a peer that promises none, and no goroutine still running.
func runChecked(p peer, sc scenario, n int) (result, error) {
	base := runtime.NumGoroutine()
	res, err := p.run(sc, n)
	if err != nil {
		return res, err
	}
	if res.dups > 0 && !traitsOf(p).atLeastOnce {
		return res, fmt.Errorf("%d duplicate deliveries from a peer that promises none", res.dups)
	}
	// Goroutines that were told to stop may take a moment to be gone.
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d goroutine(s) still running after the run returned", runtime.NumGoroutine()-base)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return res, nil
}

func rate(r result) float64   { return float64(r.msgs) / r.elapsed.Seconds() }
func allocs(r result) float64 { return float64(r.mallocs) / float64(r.msgs) }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (b *bench) medianRate(k key) (float64, bool) {
	rs := b.thr[k]
	if len(rs) == 0 {
		return 0, false
	}
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = rate(r)
	}
	return median(xs), true
}

func (b *bench) print(scs []scenario, peers []peer, took time.Duration) {
	fmt.Printf("## logbus comparison benchmark\n\n")
	fmt.Printf("- date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("- %s %s/%s, GOMAXPROCS=%d, NumCPU=%d\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU())
	var slow []string
	for _, p := range peers {
		if traitsOf(p).slow {
			slow = append(slow, p.name())
		}
	}
	fmt.Printf("- messages per run: %d (fast peers), %d (slow peers: %s); payload %d bytes; %d repetitions, medians shown; whole run took %s\n",
		*flagN, *flagNSlow, strings.Join(slow, ", "), payloadSize, *flagReps, took.Round(time.Second))
	nc := "in-process pipe (nats.InProcessServer)"
	if *flagNATSTCP {
		nc = "TCP on 127.0.0.1"
	}
	fmt.Printf("- NATS clients connect over: %s\n", nc)
	for _, sc := range scs {
		fmt.Printf("- %s: %s\n", sc.name, sc.desc)
	}
	fmt.Println()
	fmt.Println(legend)
	fmt.Println()
	fmt.Println("| scenario | peer | msgs/s | ns/msg | allocs/msg | p50 latency | p99 latency | ratio to channel |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	for _, sc := range scs {
		chanRate, haveChan := b.medianRate(key{sc.name, "chan"})
		for _, p := range peers {
			k := key{sc.name, p.name()}
			r, ok := b.medianRate(k)
			if !ok {
				continue
			}
			var al []float64
			for _, res := range b.thr[k] {
				al = append(al, allocs(res))
			}
			p50, p99 := "—", "—"
			if ls := b.lat[k]; len(ls) > 0 {
				var a, c []float64
				for _, l := range ls {
					a, c = append(a, l.p50), append(c, l.p99)
				}
				p50, p99 = fmtNS(median(a)), fmtNS(median(c))
			}
			ratio := "—"
			if haveChan {
				ratio = fmt.Sprintf("%.3f", r/chanRate)
			}
			fmt.Printf("| %s | %s | %s | %.0f | %.2f | %s | %s | %s |\n",
				sc.name, p.name(), fmtInt(r), 1e9/r, median(al), p50, p99, ratio)
		}
	}
	fmt.Println()
	fmt.Println(columns)
	if len(b.notes) > 0 {
		fmt.Println()
		for _, n := range b.notes {
			fmt.Println("- note:", n)
		}
	}
	if len(b.failures) > 0 {
		fmt.Println()
		for _, f := range b.failures {
			fmt.Println("- **FAILED**:", f)
		}
	}
}

const legend = `Guarantees differ, so read the numbers with them: **chan** (buffered Go channels) and **nats** (NATS core) have no acknowledgements — a message handed over is forgotten, and NATS core may drop for a slow consumer; **watermill** gochannel waits for each subscriber's Ack (and redelivers on Nack) but keeps no log, so nothing can be replayed and a message published with no subscriber is gone; **jetstream** (NATS JetStream, memory storage) acknowledges explicitly and retains the stream in memory, redelivering what was not acked; **logbus** acks through the handler's return value, commits an offset per group and partition, and retains a bounded log per partition that groups can replay (logbus-json is the same with the JSON codec of a small struct instead of the bytes codec; logbus-raw with codec.RawBytes, which hands each handler the log's own bytes, valid until it returns, instead of a copy). The **-batch** rows hand over up to 64 messages per call: chan-batch sends a slice of them per channel send, logbus-batch publishes them with one PublishValues/PublishBatch call, and logbus-batch-consumer does too and also consumes them in batches (SubscribeBatch, up to 64 per handler call, one commit per batch, codec.RawBytes); the guarantees are those of their peer.`

const columns = `msgs/s: messages published per second, timed from the first publish until every group had every message (so in S2 each message is delivered 4 times within that time); ns/msg is its inverse. allocs/msg: runtime.MemStats.Mallocs over the same span ÷ messages published — the whole process, so it includes the peer's background goroutines and, where a peer keeps the producer's slice, the benchmark's own 64-byte payload allocation. p50/p99 latency: publish → handler, sampled every 16th message, in a separate run paced at half of the median msgs/s. ratio to channel: msgs/s ÷ chan's msgs/s in the same scenario (one message per send), for every row, the batched ones included.`

// pick selects the items named in the comma-separated list, in list order.
func pick[T any](items []T, list string, name func(T) string) ([]T, error) {
	var out []T
	for _, want := range strings.Split(list, ",") {
		want = strings.TrimSpace(want)
		if want == "" {
			continue
		}
		i := slices.IndexFunc(items, func(it T) bool { return strings.EqualFold(name(it), want) })
		if i < 0 {
			var names []string
			for _, it := range items {
				names = append(names, name(it))
			}
			return nil, fmt.Errorf("unknown %q; choose from %s", want, strings.Join(names, ","))
		}
		out = append(out, items[i])
	}
	if len(out) == 0 {
		return nil, errors.New("nothing selected")
	}
	return out, nil
}

func fmtInt(f float64) string {
	s := fmt.Sprintf("%.0f", f)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtNS(ns float64) string {
	switch {
	case ns < 1e3:
		return fmt.Sprintf("%.0fns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.1fµs", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.2fms", ns/1e6)
	}
	return fmt.Sprintf("%.2fs", ns/1e9)
}
