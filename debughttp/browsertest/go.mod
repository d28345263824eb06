module github.com/logbus/logbus/debughttp/browsertest

go 1.26.0

require (
	github.com/chromedp/cdproto v0.160.1
	github.com/chromedp/chromedp v0.23.1
	github.com/logbus/logbus v0.3.0
)

require (
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4 // indirect
)

replace github.com/logbus/logbus => ../..
