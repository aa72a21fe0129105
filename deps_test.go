package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forbiddenInCore are the import path prefixes an application chooses for itself: the
// OpenTelemetry SDK and its exporters (telemetry/otelsetup), gRPC, the Prometheus client,
// bbolt (the file outbox), and PostgreSQL with watermill-sql (outbox/pgoutbox).
var forbiddenInCore = []string{
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/exporters",
	"google.golang.org/grpc",
	"github.com/prometheus/client_golang",
	"go.etcd.io/bbolt",
	"github.com/lib/pq",
	"github.com/jackc/pgx",
	"github.com/ThreeDotsLabs/watermill-sql",
}

// Issue 35: importing router compiled 254 non-standard packages, 66 of them gRPC, because
// router imported telemetry, which built OTLP exporters and a Prometheus registry. The
// core depends on the OpenTelemetry API only; each package below is checked with go list
// -deps, and a failure names the forbidden package and the import chain that reaches it.
func TestCoreDependsOnNoSDKExporterOrDriver(t *testing.T) {
	for _, tc := range []struct {
		pkg    string
		allow  []string // prefixes of forbiddenInCore the package may use
		maxDep int      // non-standard packages at most, sluice's own included
	}{
		{pkg: "./router", maxDep: 100},
		{pkg: "./middleware/...", maxDep: 60},
		{pkg: ".", maxDep: 20},
		{pkg: "./broker/amqp", maxDep: 40},
		{pkg: "./telemetry", maxDep: 80},
		{pkg: "./dlq", maxDep: 50},
		{pkg: "./outbox", allow: []string{"go.etcd.io/bbolt"}, maxDep: 50},
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			graph, roots := depGraph(t, tc.pkg)
			paths := slices.Sorted(maps.Keys(graph))
			var nonStd int
			for _, path := range paths {
				if strings.Contains(strings.SplitN(path, "/", 2)[0], ".") {
					nonStd++
				}
			}
			for _, bad := range forbiddenInCore {
				if slices.Contains(tc.allow, bad) {
					continue
				}
				for _, path := range paths {
					if path == bad || strings.HasPrefix(path, bad+"/") {
						t.Errorf("%s depends on %s: %s", tc.pkg, bad, strings.Join(chainTo(graph, roots, path), " -> "))
						break
					}
				}
			}
			assert.LessOrEqual(t, nonStd, tc.maxDep, "%s depends on %d non-standard packages", tc.pkg, nonStd)
		})
	}
}

// depGraph returns every package pattern depends on, with the imports of each, and the
// packages pattern names, from go list -deps.
func depGraph(t *testing.T, pattern string) (graph map[string][]string, roots []string) {
	t.Helper()
	graph, _, roots = depModules(t, pattern)
	return graph, roots
}

// depModules is depGraph with the module of each package ("std" for the standard
// library's).
func depModules(t *testing.T, pattern string) (graph map[string][]string, modules map[string]string, roots []string) {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	format := "{{.DepOnly}} {{.ImportPath}} {{with .Module}}{{.Path}}{{else}}std{{end}} {{join .Imports \" \"}}"
	out, err := exec.Command(goBin, "list", "-deps", "-f", format, pattern).CombinedOutput()
	require.NoError(t, err, "go list -deps %s: %s", pattern, out)
	graph, modules = map[string][]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		require.GreaterOrEqual(t, len(fields), 3, "go list line %q", line)
		graph[fields[1]] = fields[3:]
		modules[fields[1]] = fields[2]
		if fields[0] == "false" {
			roots = append(roots, fields[1])
		}
	}
	slices.Sort(roots)
	return graph, modules, roots
}

// chainTo returns an import chain from one of roots to target, the shortest found
// breadth first.
func chainTo(graph map[string][]string, roots []string, target string) []string {
	prev := map[string]string{}
	queue := slices.Clone(roots)
	for _, r := range roots {
		prev[r] = ""
	}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == target {
			var chain []string
			for p := cur; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, next := range graph[cur] {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return []string{target}
}

// Issue 35: router imported broker/amqp and the embedded broker, and topped its Broker up
// with type assertions, so nobody could write a third broker from its interface. Its
// non-test files now depend on package broker's contract alone: neither broker, nor the
// RabbitMQ membership, is among the packages it compiles.
func TestRouterImportsNoBroker(t *testing.T) {
	graph, roots := depGraph(t, "./router")
	require.Contains(t, graph, "github.com/sluice-go/sluice/broker", "router depends on the broker contract")
	for _, bad := range []string{
		"github.com/sluice-go/sluice/broker/amqp",
		"github.com/sluice-go/sluice/broker/memory",
		"github.com/sluice-go/sluice/internal/membership",
	} {
		if _, ok := graph[bad]; ok {
			t.Errorf("router depends on %s: %s", bad, strings.Join(chainTo(graph, roots, bad), " -> "))
		}
	}
}

// The router asks nothing of a broker beyond the declared capabilities: none of its
// non-test files asserts a concrete type (x.(*T)) or an interface it declares on the spot
// (x.(interface{ ... })).
func TestRouterAssertsNoConcreteBroker(t *testing.T) {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	dir := filepath.Join(filepath.Dir(file), "router")
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			ta, ok := n.(*ast.TypeAssertExpr)
			if !ok || ta.Type == nil {
				return true
			}
			switch ta.Type.(type) {
			case *ast.StarExpr, *ast.InterfaceType:
				t.Errorf("%s asserts %s", fset.Position(ta.Pos()), types.ExprString(ta.Type))
			}
			return true
		})
	}
	assert.Greater(t, checked, 5, "router's files were read")
}

// Issue 35: internal/ listed product plumbing and test tooling side by side. Test and
// benchmark tooling live in internal/testkit and internal/benchkit, and no library
// package compiles them.
func TestLibraryCompilesNoTestTooling(t *testing.T) {
	graph, _ := depGraph(t, "./...")
	for pkg, imports := range graph {
		if !strings.HasPrefix(pkg, modulePath) || isTooling(pkg) {
			continue
		}
		for _, imp := range imports {
			if isTooling(imp) {
				t.Errorf("%s (library code) imports test tooling %s", pkg, imp)
			}
		}
	}
	assert.Contains(t, graph, "github.com/sluice-go/sluice/internal/testkit/testenv", "the tooling is where this test looks")
}

// isTooling says whether pkg is test or benchmark tooling, or a program or test package
// that may use it.
func isTooling(pkg string) bool {
	rel := strings.TrimPrefix(pkg, "github.com/sluice-go/sluice/")
	for _, prefix := range []string{"internal/testkit/", "internal/benchkit/", "test/", "cmd/", "examples/", "tools/"} {
		if strings.HasPrefix(rel, prefix) || rel+"/" == prefix {
			return true
		}
	}
	return false
}

// modulePath is sluice's module.
const modulePath = "github.com/sluice-go/sluice"

// rabbitMQPackages are the library packages that are RabbitMQ's by design: the broker
// itself, its cluster membership, and the tools that read or write RabbitMQ's queues
// directly (the dead-letter tools and their wire format, failover, the outbox relay).
var rabbitMQPackages = []string{
	"broker/amqp",
	"dlq",
	"failover",
	"internal/dlqwire",
	"internal/membership",
	"outbox",
}

// amqpClients are RabbitMQ's client library and watermill-amqp, which compiles it (with
// backoff v3).
var amqpClients = []string{
	"github.com/rabbitmq/amqp091-go",
	"github.com/ThreeDotsLabs/watermill-amqp",
}

// Issue 53: internal/headers imported watermill-amqp for the one constant that names
// Watermill's message id header, so every broker-neutral step (retry, poison, idempotency,
// breaker, telemetry, the router) compiled RabbitMQ's client and backoff v3. No library
// package but the RabbitMQ ones compiles RabbitMQ's client; a failure names the chain.
func TestBrokerNeutralPackagesCompileNoAMQPClient(t *testing.T) {
	graph, roots := depGraph(t, "./...")
	checked := 0
	for _, pkg := range roots {
		rel, ok := strings.CutPrefix(pkg, modulePath+"/")
		if !ok && pkg != modulePath || isTooling(pkg) || slices.Contains(rabbitMQPackages, rel) {
			continue
		}
		checked++
		for _, bad := range amqpClients {
			if dep, found := dependsOn(graph, pkg, bad); found {
				t.Errorf("%s (broker-neutral) compiles %s: %s", pkg, bad, strings.Join(chainTo(graph, []string{pkg}, dep), " -> "))
				break // the client's chain names watermill-amqp when it comes through it
			}
		}
	}
	assert.Greater(t, checked, 20, "the broker-neutral packages were checked")
}

// dependsOn returns the first package, in sorted order, under prefix that pkg compiles.
func dependsOn(graph map[string][]string, pkg, prefix string) (string, bool) {
	seen := map[string]bool{pkg: true}
	queue := []string{pkg}
	var found []string
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == prefix || strings.HasPrefix(cur, prefix+"/") {
			found = append(found, cur)
		}
		for _, next := range graph[cur] {
			if !seen[next] {
				seen[next] = true
				queue = append(queue, next)
			}
		}
	}
	if len(found) == 0 {
		return "", false
	}
	return slices.Min(found), true
}

// majorVersion splits a module path into the module it is a major version of and that
// version: github.com/sony/gobreaker/v2 is github.com/sony/gobreaker at v2, gopkg.in/yaml.v3
// gopkg.in/yaml at v3, and a path without a suffix is v0 or v1.
func majorVersion(module string) (base, major string) {
	if i := strings.LastIndex(module, "/v"); i > 0 && isDigits(module[i+2:]) {
		return module[:i], module[i+1:]
	}
	if strings.HasPrefix(module, "gopkg.in/") {
		if i := strings.LastIndex(module, ".v"); i > 0 && isDigits(module[i+2:]) {
			return module[:i], module[i+1:]
		}
	}
	return module, "v1"
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// Issue 53: router compiled backoff v3, v4 and v5 and gobreaker v1 and v2: v3 through
// watermill-amqp (above), gobreaker v1 and backoff v5 through Watermill's middleware
// package, which the root package imported for its RecoveredPanicError and the router for
// its Recoverer. The broker-neutral core compiles one major version of each module; a
// failure names, for each version, the chain that brings it. (broker/amqp is not checked:
// watermill-amqp compiles backoff v3 beside sluice's v4.)
func TestCoreCompilesOneMajorVersionOfEachModule(t *testing.T) {
	for _, pkg := range []string{".", "./router", "./middleware/...", "./disposition", "./telemetry", "./broker/memory", "./internal/retrystats"} {
		t.Run(pkg, func(t *testing.T) {
			graph, modules, roots := depModules(t, pkg)
			versions := map[string]map[string]string{} // base module -> major -> a package of it
			for _, p := range slices.Sorted(maps.Keys(modules)) {
				if modules[p] == "std" {
					continue
				}
				base, major := majorVersion(modules[p])
				if versions[base] == nil {
					versions[base] = map[string]string{}
				}
				if _, ok := versions[base][major]; !ok {
					versions[base][major] = p
				}
			}
			for _, base := range slices.Sorted(maps.Keys(versions)) {
				if len(versions[base]) < 2 {
					continue
				}
				var chains []string
				for _, major := range slices.Sorted(maps.Keys(versions[base])) {
					chains = append(chains, major+": "+strings.Join(chainTo(graph, roots, versions[base][major]), " -> "))
				}
				t.Errorf("%s compiles %d major versions of %s:\n\t%s", pkg, len(chains), base, strings.Join(chains, "\n\t"))
			}
		})
	}
}

// Issue 53: broker/amqp imported broker/memory for ConnectOrEmbedded, so every RabbitMQ
// program compiled the embedded broker. A broker depends on the contract (package broker)
// and on no other broker; a failure names the chain.
func TestBrokerImportsNoOtherBroker(t *testing.T) {
	graph, _ := depGraph(t, "./broker/...")
	brokerPrefix := modulePath + "/broker/"
	var brokers []string
	for pkg := range graph {
		if rest, ok := strings.CutPrefix(pkg, brokerPrefix); ok && !strings.Contains(rest, "/") {
			brokers = append(brokers, pkg)
		}
	}
	slices.Sort(brokers)
	require.Contains(t, brokers, brokerPrefix+"amqp")
	require.Contains(t, brokers, brokerPrefix+"memory")
	for _, b := range brokers {
		for _, other := range brokers {
			if other == b {
				continue
			}
			if dep, found := dependsOn(graph, b, other); found {
				t.Errorf("%s imports another broker, %s: %s", b, other, strings.Join(chainTo(graph, []string{b}, dep), " -> "))
			}
		}
	}
}
