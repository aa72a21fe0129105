// Command brokerversion prints the version a RabbitMQ node reports when a connection opens
// ("4.3.6"), for scripts/test.sh: the version a test part is labelled with is the one its
// node says it runs, and a node of another series than the part claims fails the run.
//
//	brokerversion URL               # prints the version; exit 2 when no node answers
//	brokerversion -series 4.3 URL   # also exit 1, naming the version, when it is not 4.3.x
//
// The URL's password never reaches the output.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

func main() {
	series := flag.String("series", "", "fail unless the node's version is of this `major.minor` series")
	timeout := flag.Duration("timeout", 5*time.Second, "how long to wait for the connection")
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	url := flag.Arg(0)
	v, err := testenv.BrokerVersion(url, *timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "brokerversion: %v\n", err)
		os.Exit(2)
	}
	fmt.Println(v)
	if *series != "" && testenv.SeriesOf(v) != *series {
		fmt.Fprintf(os.Stderr, "brokerversion: the RabbitMQ node at %s is %s, not %s.x\n", mask.Credentials(url), v, *series)
		os.Exit(1)
	}
}
