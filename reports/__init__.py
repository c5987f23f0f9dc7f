"""ttft.reports"""
