package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The program, run briefly: /metrics answers with the semconv messaging
// metrics and logbus's own, the debug page with the broker's topic and
// groups; and it stops when its context ends.
func TestRunServesMetricsAndDebugPage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, config{addr: "127.0.0.1:0", rate: 200}, func(addr string) { addrs <- addr }) }()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("run returned before it was ready: %v", err)
	case <-time.After(30 * time.Second): // a bound, not a wait: ready comes once a publish and a delivery were measured
		t.Fatal("run was not ready within 30s")
	}

	metrics := fetch(t, "http://"+addr+"/metrics", "")
	for _, want := range []string{
		"# TYPE messaging_client_sent_messages_total counter",
		"# TYPE messaging_client_operation_duration_seconds histogram",
		"# TYPE messaging_client_consumed_messages_total counter",
		"# TYPE messaging_process_duration_seconds histogram",
		"# TYPE logbus_consumer_lag gauge",
		"# TYPE logbus_consumer_lag_age_seconds gauge",
		"# TYPE logbus_consumer_stuck gauge",
		"# TYPE logbus_consumer_dead_letters_total counter",
		"# TYPE logbus_consumer_retries_total counter",
		"# TYPE logbus_consumer_skipped_total counter",
		"# TYPE logbus_records_dropped_total counter",
		`logbus_consumer_lag{messaging_consumer_group_name="audit",messaging_destination_name="orders",messaging_destination_partition_id="0",messaging_system="logbus"}`,
		`messaging_client_sent_messages_total{messaging_destination_name="orders",messaging_destination_partition_id="`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", metrics)
	}

	var page struct {
		Topics []struct {
			Name   string `json:"name"`
			Groups []struct {
				Name string `json:"name"`
			} `json:"groups"`
		} `json:"topics"`
	}
	if err := json.Unmarshal([]byte(fetch(t, "http://"+addr+"/debug/logbus/", "application/json")), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Topics) != 1 || page.Topics[0].Name != "orders" || len(page.Topics[0].Groups) != 3 ||
		page.Topics[0].Groups[0].Name != "audit" || page.Topics[0].Groups[1].Name != "billing" || page.Topics[0].Groups[2].Name != "mailer" {
		t.Errorf("the debug page's JSON: %+v, want topic orders read by audit, billing and mailer", page)
	}
	if html := fetch(t, "http://"+addr+"/debug/logbus/", "text/html"); !strings.Contains(html, "<title>logbus</title>") {
		t.Error("the debug page's HTML has no logbus title")
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

func fetch(t *testing.T, url, accept string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true // no idle connection left for goleak to find
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}
