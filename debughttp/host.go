package debughttp

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// guarded reports whether the handler checks every request's Host: when
// it can change the broker or shows message bytes, the things a DNS
// rebinding attack would be after (see the package doc).
func (c *config) guarded() bool { return c.actions || c.payloads }

// hostAllowed reports whether r's Host names the handler in a way DNS
// rebinding cannot forge: localhost or a name under .localhost (which
// browsers resolve to loopback themselves), an IP address (which no DNS
// answer can change), or a name given to [WithAllowedHosts]. A request
// without a Host (HTTP/1.0) is allowed: no browser sends one.
func (c *config) hostAllowed(r *http.Request) bool {
	host := hostname(r.Host)
	switch {
	case host == "", host == "localhost", strings.HasSuffix(host, ".localhost"), c.hosts[host]:
		return true
	}
	_, err := netip.ParseAddr(host)
	return err == nil
}

// hostname is host without its port and brackets, lower-case, without a
// final dot.
func hostname(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.TrimSuffix(strings.ToLower(host), ".")
}
