# sluice bench - plot.gp: proxy CPU-seconds per 10k requests for every row.
# run.py calls: gnuplot -e "datafile='...'; outfile='...'; subtitle='...'" plot.gp
# The data file has one line per row: index, "label", CPU-s per 10k.
set terminal png size (exists("width") ? width : 1100),600 font ",11"
set output outfile
set title "Proxy CPU-seconds per 10k requests (lower is better)\n{/*0.8 ".subtitle."}"
set ylabel "CPU-seconds / 10k requests"
set style fill solid 0.75 border -1
set boxwidth 0.6
set yrange [0:*]
set offsets 0.5, 0.5, graph 0.1, 0
set grid ytics
set xtics nomirror noenhanced
set bmargin 5
plot datafile using 1:3:xtic(2) with boxes linecolor rgb "#3b6ea5" notitle, \
     '' using 1:3:(sprintf("%.3f", $3)) with labels offset 0,0.8 notitle
