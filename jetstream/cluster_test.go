package jetstream

// A cluster of real NATS servers for the tests: each node is this test
// binary started again as a child process (TestMain sees nodeEnv and runs
// runNode instead of the tests), so that a node can be killed with
// SIGKILL, as a crashed machine would be: an embedded server stopped
// in-process steps its Raft leaders down first, which is a clean handover,
// not a crash. Everything listens on 127.0.0.1, stores in the test's temp
// dirs, and is killed at the test's cleanup; a node whose parent dies
// exits when its stdin closes.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// nodeEnv holds a node's configuration (JSON) in a child process.
const nodeEnv = "LOGBUS_TEST_NODE"

// clusterEnv gates the tests that run a cluster: they take a minute or
// more, so CI runs them as a step of their own.
const clusterEnv = "LOGBUS_CLUSTER"

// needCluster skips the test unless LOGBUS_CLUSTER=1.
func needCluster(t *testing.T) {
	t.Helper()
	if os.Getenv(clusterEnv) != "1" {
		t.Skipf("starts a cluster of NATS servers; set %s=1 to run it", clusterEnv)
	}
}

// nodeConfig is what a child process needs to run one server.
type nodeConfig struct {
	Name        string
	Dir         string
	Port        int    // clients
	ClusterPort int    // routes
	Routes      string // every node's route URL, comma-separated ("" for a server alone)
}

// runNode runs one server as configured and blocks until stdin closes
// (the parent closed it, or died). It prints "ready" once the server
// accepts connections.
func runNode(cfgJSON string) int {
	var c nodeConfig
	if err := json.Unmarshal([]byte(cfgJSON), &c); err != nil {
		fmt.Fprintln(os.Stderr, "node config:", err)
		return 2
	}
	opts := &server.Options{ServerName: c.Name, Host: "127.0.0.1", Port: c.Port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: c.Dir}
	if c.Routes != "" {
		opts.Cluster = server.ClusterOpts{Name: "logbus-test", Host: "127.0.0.1", Port: c.ClusterPort}
		opts.Routes = server.RoutesFromStr(c.Routes)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 2
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "node: not ready after 30s")
		return 2
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}

// testCluster is a set of nodes; node i is named n<i+1>.
type testCluster struct {
	t     testing.TB
	nodes []*testNode
}

type testNode struct {
	cfg   nodeConfig
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed once the process exited and was waited for
}

// freePorts returns n ports of 127.0.0.1 that were free a moment ago.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// startCluster starts n nodes that form one JetStream cluster (n = 1: a
// server alone), and waits until it can place a stream of n replicas.
// The nodes are killed at cleanup.
func startCluster(tb testing.TB, n int) *testCluster {
	tb.Helper()
	c := &testCluster{t: tb}
	ports := freePorts(tb, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	base := tb.TempDir()
	for i := range n {
		cfg := nodeConfig{Name: fmt.Sprintf("n%d", i+1), Dir: filepath.Join(base, fmt.Sprintf("n%d", i+1)),
			Port: ports[i], ClusterPort: ports[n+i]}
		if n > 1 {
			cfg.Routes = strings.Join(routes, ",")
		}
		c.nodes = append(c.nodes, &testNode{cfg: cfg})
	}
	tb.Cleanup(func() {
		for i := range c.nodes {
			c.kill(i)
		}
	})
	for i := range c.nodes {
		c.start(i)
	}
	c.waitReady(n)
	return c
}

// start starts node i's process (again, after kill or stop: same name,
// ports and store) and waits until it accepts connections.
func (c *testCluster) start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	cfg, _ := json.Marshal(nd.cfg)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), nodeEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	nd.cmd, nd.stdin, nd.done = cmd, stdin, make(chan struct{})
	ready := make(chan bool, 1)
	go func() { // exits when the process has exited and its output is read
		sc := bufio.NewScanner(stdout)
		ok := sc.Scan() && sc.Text() == "ready"
		ready <- ok
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(nd.done)
	}()
	if !<-ready {
		c.kill(i)
		c.t.Fatalf("node %s did not start", nd.cfg.Name)
	}
}

// kill kills node i's process (SIGKILL) and waits for it to exit. A node
// not running is left alone.
func (c *testCluster) kill(i int) {
	nd := c.nodes[i]
	if nd.cmd == nil {
		return
	}
	_ = nd.cmd.Process.Kill()
	<-nd.done
	nd.cmd = nil
}

// url is the client URL of every node, comma-separated, for nats.Connect.
func (c *testCluster) url() string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.cfg.Port))
	}
	return strings.Join(urls, ",")
}

// connect opens a connection to the cluster, closed at cleanup, that
// reconnects at once to a node that is up and never gives up.
func (c *testCluster) connect(name string) *nats.Conn {
	c.t.Helper()
	nc, err := nats.Connect(c.url(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectJitter(0, 0), nats.Timeout(2*time.Second))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// waitReady waits until the cluster can create and delete a stream of
// replicas replicas: the meta leader is elected and knows enough peers.
func (c *testCluster) waitReady(replicas int) {
	c.t.Helper()
	nc := c.connect("ready")
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	ready := poll(60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = js.CreateStream(ctx, natsjs.StreamConfig{Name: "READY", Subjects: []string{"ready"},
			Replicas: replicas, Storage: natsjs.MemoryStorage})
		if err == nil {
			err = js.DeleteStream(ctx, "READY")
		}
		return err == nil
	})
	if !ready {
		c.t.Fatalf("the cluster of %d is not ready after 60s: %v", len(c.nodes), err)
	}
}

// leaders returns, for each stream named, the name of the node leading it
// ("" when it has none now).
func leaders(ctx context.Context, js natsjs.JetStream, streams ...string) ([]string, error) {
	out := make([]string, len(streams))
	for i, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		if info := s.CachedInfo(); info.Cluster != nil {
			out[i] = info.Cluster.Leader
		}
	}
	return out, nil
}

// mostLeader returns the index of the node that leads most of the streams
// named by leads (the first such node on a tie), and how many it leads.
func (c *testCluster) mostLeader(leads []string) (int, int) {
	best, n := 0, -1
	for i, nd := range c.nodes {
		if k := countOf(leads, nd.cfg.Name); k > n {
			best, n = i, k
		}
	}
	return best, n
}

func countOf(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// names returns the nodes' names.
func (c *testCluster) names() []string {
	var out []string
	for _, nd := range c.nodes {
		out = append(out, nd.cfg.Name)
	}
	return slices.Clip(out)
}

// asset names a stream, or a durable consumer of a stream.
type asset struct{ stream, consumer string }

// waitLeaders waits until the cluster's meta group (which creates and
// looks up streams, consumers and buckets) and every asset have a leader
// (after a server was lost, each Raft group elects one 4-9s later, each
// on its own timer), or fails the test after 30s. Polled: an election is
// not an event the client can wait on.
func waitLeaders(t testing.TB, js natsjs.JetStream, assets []asset) {
	t.Helper()
	missing := ""
	led := poll(30*time.Second, func() bool {
		missing = ""
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := js.AccountInfo(ctx); err != nil {
			missing = fmt.Sprintf("the meta group: %v", err)
		}
		cancel()
		for _, a := range assets {
			if missing != "" {
				break
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			var cl *natsjs.ClusterInfo
			s, err := js.Stream(ctx, a.stream)
			if err == nil && a.consumer == "" {
				cl = s.CachedInfo().Cluster
			} else if err == nil {
				var c natsjs.Consumer
				if c, err = s.Consumer(ctx, a.consumer); err == nil {
					cl = c.CachedInfo().Cluster
				}
			}
			cancel()
			if err != nil || cl == nil || cl.Leader == "" {
				missing = fmt.Sprintf("%s %s: %v", a.stream, a.consumer, err)
				break
			}
		}
		return missing == ""
	})
	if !led {
		t.Fatalf("no leader after 30s: %s", missing)
	}
}
